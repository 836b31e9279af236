"""verl 0.9.1 drop-in: the replay-buffer classes verl's trainer uses, over the core buffer and
TransferQueue."""
from __future__ import annotations

from pipeline._face import face

__getattr__, __dir__, __all__ = face(__name__, {
    'DAPO_FILTERED_REWARD_COUNTS_KEY': 'dropin',
    'FILTER_GROUPS_REWARD_METRIC': 'dropin',
    'ReplayBuffer': 'dropin:VerlBuffer',   # verl's name for it
    'VerlBuffer': 'dropin',
    'ReplayBufferAsync': 'dropin',
    'ReplaylakeSampler': 'dropin',
    'VerlStrategyError': 'dropin',
    'VerlThresholdError': 'dropin',
})
