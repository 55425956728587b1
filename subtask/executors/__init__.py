"""The executors' backends: a module per executor that runs jobs away from this machine (`ray`),
at the operations layer (they bring jobs home, sync and move groups on with `ops`).

The registry of executors (which exist, what each can do, which runs a job) is data, in
`subtask.model.executors`, so that `ops` may ask it without importing its backends: the two
folders never import each other both ways. Its names are re-exported here for the layers above.
"""

from subtask.model.executors import (
                                     EXECUTORS,
                                     FEATURES,
                                     REGISTRY,
                                     Elsewhere,
                                     Executor,
                                     choose,
                                     elsewhere,
                                     of,
                                     of_entry,
                                     placement,
                                     ray_job_id,
                                     runs_remotely,
)

__all__ = ["EXECUTORS", "FEATURES", "Elsewhere", "Executor", "REGISTRY", "choose", "elsewhere", "of", "of_entry",
           "placement", "ray_job_id", "runs_remotely"]
