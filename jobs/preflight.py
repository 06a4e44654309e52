"""The preflight as a job a user launches from the UI: the checks of ``cdc-assets preflight``
(``cdc_assets.preflight``) on the config the code location loaded, their table in the run's log and metadata."""

from typing import Any

from dagster import Failure, JobDefinition, MetadataValue, OpExecutionContext, Output, in_process_executor, job, op

from cdc_assets.config import PipelineConfig
from cdc_assets.preflight import results_table, run_preflight, summary

PREFLIGHT_JOB = "cdc_preflight_job"


def build_preflight_job(config: PipelineConfig) -> JobDefinition:
    """The job that checks every connection of ``config`` (``run_preflight``); it fails when one check does,
    its failure naming the failed checks, one line each."""

    @op(name="cdc_preflight", description="Check the broker, the topics, the schema registry, the Delta root and "
                                          "the signal channels, each within a time bound.")
    def cdc_preflight(context: OpExecutionContext) -> Output[None]:
        results = run_preflight(config)
        table = results_table(results)
        verdict = summary(config, results)
        context.log.info(f"{verdict}\n{table}")
        failed = [result for result in results if result.failed]
        metadata: dict[str, Any] = {"checks": MetadataValue.md(f"```\n{table}\n```"), "failed": len(failed)}
        if failed:
            raise Failure(description="; ".join(f"{r.check} {r.target}: {r.detail} (config: {r.field})"
                                                for r in failed), metadata=metadata, allow_retries=False)
        return Output(None, metadata=metadata)

    @job(name=PREFLIGHT_JOB, executor_def=in_process_executor,
         description="Check every connection of the pipeline config before a first run (cdc-assets preflight).")
    def preflight_job() -> None:
        cdc_preflight()

    return preflight_job
