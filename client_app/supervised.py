"""Client half of FedAvg-SL / FedProx-SL: supervised training on the client's true labels."""

from __future__ import annotations

import torch

from client_app.base import ClientHalf
from tasks.train import supervised_epochs


class SupervisedClient(ClientHalf):
    """The upper bound: the client's data comes with its labels (weak augmentation)."""

    def train(self) -> dict[str, float]:
        d = self.data
        if d.true_y is None:
            raise ValueError(
                f"method {self.cfg['method']!r} trains on the clients' true labels, but node "
                f"{d.partition_id} has only unlabeled images (data-path); use an SSL method"
            )
        x = torch.cat([d.x, d.labeled_x])
        y = torch.cat([d.true_y, d.labeled_y])
        weak, _ = self.augmenters()
        out = supervised_epochs(
            self.model,
            x,
            y,
            epochs=self.cfg["client"]["epochs"],
            optimizer=self.optimizer(),
            batch_size=self.cfg["client"]["batch_size"],
            generator=self.generator,
            augment=weak,
            proximal_mu=self.cfg["client"]["proximal_mu"],
        )
        return {"train_loss": out["loss"]}
