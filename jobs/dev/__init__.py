"""Maintainer tools (`replaylake dev ...`): the crash soak (soak, soak_jobs, crash_workload,
crash_interrupt) and the GPU check. Nothing here is needed to use replaylake."""
