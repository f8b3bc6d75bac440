"""fedsim: federated learning under intermittent device availability, simulated.

Public API: ``load_config``, ``run``, ``RunResult``, ``read_trace``, ``write_trace``.
"""

__version__ = "0.1.0"

from fedsim.config import load_config  # noqa: E402
from fedsim.errors import FedsimError  # noqa: E402
from fedsim.experiment import RunResult, run  # noqa: E402
from fedsim.traces import read_trace, write_trace  # noqa: E402

__all__ = ["load_config", "run", "RunResult", "read_trace", "write_trace", "FedsimError",
           "__version__"]
