"""Server-side algorithms behind the Strategy interface; importing registers them all.

One module per family: ``fedavg`` (fedavg, fedavg-all, fedavg-known-p, fedsgd, fedprox),
``waiting`` (fedavg-wait), ``mifa`` (mifa, fedlaavg), ``fedvarp``, ``fedawe``, ``amplified``,
``fedau``, ``sequential`` (sequential-sgd). ``selection`` holds the selection policies and
``table`` the per-device [N, d] state they share.
"""

from fedsim.algorithms.base import (
    REGISTRY,
    Arrivals,
    Context,
    Strategy,
    algorithm_options,
    make_strategy,
    register,
)
from fedsim.algorithms import (  # noqa: F401  (registration)
    amplified,
    fedau,
    fedavg,
    fedawe,
    fedvarp,
    mifa,
    sequential,
    waiting,
)

__all__ = ["REGISTRY", "Arrivals", "Context", "Strategy", "algorithm_options", "make_strategy",
           "register"]
