"""The tests' one helper package (fixtures stay in tests/conftest.py). Import what you need from
its modules, e.g. ``from tests.support.lake import traj, add_group``:

- ``lake``: trajectory rows, one-call groups, lake read-backs, child pythons.
- ``lake_damage``: damage a lake the way a crash or a bad disk would.
- ``syscall_trace``, ``disk_model``, ``disk_calls``, ``power_loss``, ``power_loss_runs``: record a
  run's system calls with strace and rebuild the disks a power loss could leave.
- ``policies``: groups with given rewards, a scripted refill, background producers.
- ``ray_producers``: producer code Ray workers run (importable by reference).
- ``sql_runs``: deterministic buffer runs writing a real lake for the SQL tests.
- ``sql_cases``: the SQL case files -> DuckDB relations, and row comparison.
- ``torch_reference``: Batch-shaped tables and the naive to_torch reference.
- ``vllm_shapes``: vLLM 0.33's output classes, field for field.
"""
