"""Configuration as frozen values: the buffer's settings, the sync/async presets, partitions."""
from __future__ import annotations

from pipeline._face import face

__getattr__, __dir__, __all__ = face(__name__, {
    'BufferConfig': 'buffer_config',
    'STRATEGIES': 'buffer_config',
    'StrategyError': 'buffer_config',
    'ThresholdError': 'stale_bounds',
    'async_config': 'buffer_config',
    'sync_config': 'buffer_config',
    'preset_kwargs': 'keywords',
    'PREFIXES': 'partitions',
    'opt_in_rules': 'rule_knobs',
    'rule_uses': 'rule_knobs',
    'rules_from_options': 'rule_knobs',
    'switchable_rules': 'rule_knobs',
    'with_sugar': 'rule_knobs',
    'ask_refill': 'partitions',
    'is_validation': 'partitions',
    'metric_prefix': 'partitions',
})
