"""fedsim: federated learning under intermittent device availability, simulated.

Public API: ``load_config``, ``run``, ``resume``, ``RunResult``, ``read_trace``, ``write_trace``, ``test_data``.

The names load on first use (PEP 562), because every ``import fedsim.x`` runs this file
first: ``fedsim --help`` or ``fedsim trace info`` must not pay for torch.
"""

from __future__ import annotations

import importlib
import sys

__version__ = "0.1.0"  # the one place: pyproject.toml reads it (dynamic version)
DISTRIBUTION = "fedsim-avail"  # the name on the package index; `fedsim` there is another project

__all__ = ["load_config", "run", "resume", "RunResult", "read_trace", "write_trace", "test_data", "FedsimError",
           "__version__"]


def lazy_exports(package: str, homes: dict[str, str]):
    """PEP 562 ``__getattr__`` and ``__dir__`` for `package`: each name in `homes` is imported
    from the module `homes[name]` when it is first looked up, then kept."""
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str):
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        namespace[name] = getattr(importlib.import_module(homes[name]), name)
        return namespace[name]

    def __dir__() -> list[str]:
        return sorted({*namespace, *homes})

    return __getattr__, __dir__


__getattr__, __dir__ = lazy_exports(__name__, {
    "load_config": "fedsim.config",
    "FedsimError": "fedsim.errors",
    "RunResult": "fedsim.runs.experiment",
    "run": "fedsim.runs.comparison",
    "resume": "fedsim.runs.comparison",
    "read_trace": "fedsim.traces.io",
    "write_trace": "fedsim.traces.io",
    "test_data": "fedsim.runs.scoring",
})
