"""The compilers of the JVMs the suite starts: C1 only (``TEST_JVM_OPTIONS``, through the environment's
``JDK_JAVA_OPTIONS``, which xdist's workers and every process they start inherit), but for the Spark servers
the tests keep busy for long, which keep C2 (``compiling_with_c2``). Production keeps the JVM's default."""

import contextlib
import os
from collections.abc import Iterator

# The JVMs the suite starts (Kafka, Kafka Connect, Debezium, Apicurio, Spark clusters and the Spark servers of other
# settings) compile with C1 only: their work is too short to repay C2. On two modules (2026-11-30) the Spark servers
# spent 263 CPU s against 314, their JIT compilers 19 s against 136.
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1"

# The session's main Spark server (the ``spark`` fixture) keeps C2, which the merge tests, busy on it for the whole
# run, need (with C1 only they took 16 % longer), but compiles a method with C2 only after four times the JVM's
# default count of calls and loops: the tests' many small queries of different shapes kept C2 compiling half of the
# server's CPU. On merge/test_semantics.py alone (2026-12-01) the server used 312 CPU s against 390 and 396 with
# the default, its compilers 109 s against 195 (ten times the count: 353 s).
MAIN_SERVER_JVM_OPTIONS = ("-XX:Tier4InvocationThreshold=20000 -XX:Tier4MinInvocationThreshold=2400 "
                           "-XX:Tier4CompileThreshold=60000 -XX:Tier4BackEdgeThreshold=160000")


@contextlib.contextmanager
def compiling_with_c2() -> Iterator[None]:
    """JVMs started inside the block compile with C2 at ``MAIN_SERVER_JVM_OPTIONS``'s counts, not C1 only."""
    options = os.environ.get("JDK_JAVA_OPTIONS", "")
    os.environ["JDK_JAVA_OPTIONS"] = f"{options.replace(TEST_JVM_OPTIONS, '')} {MAIN_SERVER_JVM_OPTIONS}".strip()
    try:
        yield
    finally:
        os.environ["JDK_JAVA_OPTIONS"] = options
