"""Server-side algorithms behind the Strategy interface (the names: fedsim/config/catalog.py).

One module per family: ``fedavg`` (fedavg, fedavg-all, fedavg-known-p, fedsgd, fedprox),
``waiting`` (fedavg-wait), ``mifa`` (mifa, fedlaavg), ``fedvarp``, ``fedawe``, ``amplified``,
``fedau``, ``sequential`` (sequential-sgd), ``fednova``; each is imported when a run first names it.
``selection`` holds the selection policies and ``table`` the per-device [N, d] state they share.
"""

from fedsim.algorithms.base import (
    REGISTRY,
    Arrivals,
    Context,
    Strategy,
    algorithm_options,
    make_strategy,
    planned_state,
    register,
)

__all__ = ["REGISTRY", "Arrivals", "Context", "Strategy", "algorithm_options", "make_strategy",
           "planned_state", "register"]
