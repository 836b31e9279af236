"""What `bench verl` writes into TransferQueue and how it reports a timed series: finished groups
as verl's agent loop writes them (prompt tags, then 4 trajectories each with their fields and
tags, then the terminal status), and a series' median, quartiles and extremes."""
from __future__ import annotations

import statistics
from typing import Any

PART, STEP, PER_GROUP, CHUNK = "train", 10, 4, 500


def write_groups(tq: Any, uids: list[str], part: str = PART) -> None:
    """Finished groups as verl writes them: prompt tags, then 4 trajectories each, then status."""
    import torch
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict
    for c in range(0, len(uids), CHUNK):
        chunk = uids[c:c + CHUNK]
        tq.kv_batch_put(keys=chunk, partition_id=part, tags=[
            {"is_prompt": True, "status": "running", "global_steps": STEP} for _ in chunk])
        keys, fields, tags = [], [], []
        for u in chunk:
            for s in range(PER_GROUP):
                rm = torch.zeros(8, dtype=torch.float32)
                rm[-1] = float(s % 2)
                fields.append({"prompts": torch.arange(6), "responses": torch.arange(8),
                               "response_mask": torch.ones(8, dtype=torch.int64), "rm_scores": rm,
                               "extra_fields": {"reward_extra_info": {"acc": float(s % 2)},
                                                "global_steps": STEP - 1,
                                                "min_global_steps": STEP - 1,
                                                "max_global_steps": STEP - 1},
                               "uid": u, "session_id": s, "global_steps": STEP})
                tags.append({"status": "success", "prompt_len": 6, "response_len": 8,
                             "seq_len": 14, "global_steps": STEP, "min_global_steps": STEP - 1,
                             "max_global_steps": STEP - 1})
                keys.append(f"{u}_{s}_0")
        tq.kv_batch_put(keys=keys, partition_id=part, fields=list_of_dict_to_tensordict(fields),
                        tags=tags)
        tq.kv_batch_put(keys=chunk, partition_id=part, tags=[{"status": "finished"} for _ in chunk])


def spread(times: list[float], first: float) -> dict[str, float]:
    """A timed series in ms: the cold call, median, quartiles and extremes of the steady calls."""
    q1, _, q3 = statistics.quantiles(times, n=4, method="inclusive") if len(times) > 1 else (times[0],) * 3
    return {"first_ms": first * 1e3, "median_ms": statistics.median(times) * 1e3,
            "p25_ms": q1 * 1e3, "p75_ms": q3 * 1e3, "min_ms": min(times) * 1e3,
            "max_ms": max(times) * 1e3, "timed_calls": len(times)}
