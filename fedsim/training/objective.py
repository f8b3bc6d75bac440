"""What an algorithm adds to its devices' local loss, declared in one place the trainers read.

The local loss is the task's loss plus these terms. Today: FedProx's proximal term
(mu/2)·‖w − w_start‖². New terms (control variates, say) become fields here and a line in
`sgd_update_`, without another argument travelling through the servers and trainers.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LocalObjective:
    prox_mu: float = 0.0  # weight of the proximal term; 0 = off

    @property
    def uses_start(self) -> bool:
        """Whether a step needs the parameters the device started the round from."""
        return self.prox_mu != 0.0


PLAIN = LocalObjective()
