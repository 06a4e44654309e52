"""Jobs of the code location."""

from jobs.merge import cdc_merge_job

__all__ = ["cdc_merge_job"]
