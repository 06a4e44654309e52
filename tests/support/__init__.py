"""What the tests share: private servers, the conformance harness and workloads, and helpers several test modules use
(no test module imports another)."""
