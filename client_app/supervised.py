"""Client half of FedAvg-SL / FedProx-SL: supervised training on the client's true labels."""

from __future__ import annotations

import torch

from client_app.base import ClientHalf
from tasks.train import supervised_epochs


class SupervisedClient(ClientHalf):
    """The upper bound: the client's data comes with its labels (weak augmentation)."""

    honours = ClientHalf.honours | {"client.local_steps", "lr_schedule.name", "client.proximal_mu"}

    def train(self) -> dict[str, float]:
        d, ccfg = self.data, self.settings.client
        if d.true_y is None:
            raise ValueError(
                f"method {self.settings.method!r} trains on the clients' true labels, but node "
                f"{d.partition_id} has only unlabeled images (data-path); use an SSL method"
            )
        x = torch.cat([d.x, d.labeled_x])
        y = torch.cat([d.true_y, d.labeled_y])
        weak = self.weak_view()
        round_steps = self.round_steps(len(x))
        out = supervised_epochs(
            self.model,
            x,
            y,
            epochs=ccfg.epochs,
            optimizer=self.optimizer(),
            batch_size=ccfg.batch_size,
            generator=self.generator,
            augment=weak,
            proximal_mu=ccfg.proximal_mu,
            local_steps=ccfg.local_steps,
            lr_at=lambda step: self.lr_at(step, round_steps),
        )
        return {"train_loss": out["loss"], "local_steps": out["steps"]}
