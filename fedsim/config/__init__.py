"""Configuration: the keys of every section and their rules (schema.py), config files layered
with `extends` and --set (layers.py), what `fedsim config show` prints (show.py), and every
named choice (catalog.py, over the registries of registry.py).

The rest of fedsim imports the schema and `load_config` from here; the modules of this
package import from each other, never from the package, so that none waits on another.
"""

from fedsim.config.layers import load_config
from fedsim.config.schema import (
    Rule,
    key,
    rule,
    TRACKERS,
    DEVICE_MODELS,
    RunConfig,
    DataConfig,
    ModelConfig,
    TraceConfig,
    ServerConfig,
    ClientConfig,
    AlgorithmConfig,
    DevicesConfig,
    DEVICE_MODEL_KEYS,
    Config,
    RESUME_KEYS,
    check_resume_overrides,
    suggest,
    algorithm_options,
    selection_options,
    trace_options,
    config_from_dict,
    MODEL_DEFAULTS,
    parse_override,
    read_toml,
    scenario_names,
    scenario_path,
    is_study,
    config_scenarios,
    dump_toml,
    plain_folder_name,
    NO_ACCURACY_DATASETS,
    MAX_TASK_STEPS,
    invite_budget,
    MAX_RUN_STEPS,
    check_cohort_size,
    check_run_steps,
    check_option,
)

__all__ = ["load_config", "Rule", "key", "rule", "TRACKERS", "DEVICE_MODELS", "RunConfig", "DataConfig", "ModelConfig", "TraceConfig", "ServerConfig", "ClientConfig", "AlgorithmConfig", "DevicesConfig", "DEVICE_MODEL_KEYS", "Config", "RESUME_KEYS", "check_resume_overrides", "suggest", "algorithm_options", "selection_options", "config_from_dict", "MODEL_DEFAULTS", "parse_override", "read_toml", "scenario_names", "scenario_path", "is_study", "config_scenarios", "dump_toml", "plain_folder_name", "NO_ACCURACY_DATASETS", "MAX_TASK_STEPS", "MAX_RUN_STEPS", "check_cohort_size", "check_run_steps", "check_option", "invite_budget"]
