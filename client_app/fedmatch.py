"""FedMatch's client half (Jeong et al. 2021): disjoint learning with helpers, sparse traffic.

The client rebuilds the server's public model from a sparse payload against the copy it
kept in ``context.state`` (the payload names the round of that copy), decodes its
helpers, and trains: with labels at the client, a sigma step on a labeled batch with psi
frozen (eq. 4), then for every unlabeled batch a psi step with sigma frozen (eq. 5) on

    lambda_a CE(agreement label, p(pi(u))) + lambda_i (1/H) sum_j KL(p_hj(u) || p(u))
    + lambda_L1 ||psi||_1 + lambda_L2 ||sigma - psi||^2,

both consistency terms on the samples whose local confidence reaches tau (eq. 1-3, 5).
Finally psi elements at or below the l1 threshold are zeroed, and the client uploads
the elements that moved by more than delta since the received model.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from flwr.app import Array, ArrayRecord

from client_app.base import ClientHalf
from tasks.augment import augment_grouped, engine_class
from tasks.decompose import (
    BUFFER,
    Decomposed,
    buffer_arrays,
    decomposition_penalty,
    dense_model_bytes,
    uploaded_parts,
)
from tasks.fedmatch import agreement_labels, inter_client_kl
from tasks.models import model_for
from tasks.settings import (
    MAX_BATCH,
    MAX_CLIENTS,
    MAX_ROUNDS,
    NON_NEGATIVE,
    POSITIVE,
    UNIT,
    RandAugmentSettings,
    again,
    between,
    setting,
)
from tasks.sparse import decode, encode_changes, payload_arrays, payload_from
from tasks.train import cycled_batch, make_sgd, minibatches, running_sum


@dataclass(frozen=True)
class FedMatchSettings(RandAugmentSettings):
    """FedMatch's keys: the official code's labels-at-server values (reference-
    implementations.md; paper Table 4); labels-at-client experiments set their own."""

    randaugment_m: float = again(RandAugmentSettings, "randaugment_m", 5.0)  # official: 2..5
    strong_view: str = setting(
        "official",
        "pi(u) of eq. 2: `official` = the official code's draw: 6 ops a view, each at its own "
        "level l in 0..M-1 with M in 2..5 drawn per view, our op ranges at l/9 of their "
        "maximum, rotation by exactly 40 x l degrees (`randaugment_n`, `randaugment_m` are "
        "then refused unless at their defaults); `ours` = RandAugment(`randaugment_n`, "
        "`randaugment_m`), the default until 2026-11",
        choices=("ours", "official"),
        ref="FedMatch official randaug.py, loader.py",
    )
    decomposition: bool = setting(
        True,
        'false: theta = sigma (the "FedMatch (w/o)" ablation)',
        ref="FedMatch eq. 4-5, Table 2",
    )
    psi_factor: float = setting(0.2, "psi starts as this times sigma (official code)", rule=UNIT)
    num_helpers: int = setting(
        2,
        "H helpers per client (0: the no-helper ablation)",
        rule=between(0, MAX_CLIENTS),
        ref="FedMatch Tables 1-2",
    )
    helper_interval: int = setting(
        10,
        "helpers travel every this-th round",
        rule=between(1, MAX_ROUNDS),
        ref="FedMatch 3.1",
    )
    confidence: float = setting(
        0.75,
        "tau of the agreement pseudo-labels (official code; paper 0.85)",
        rule=UNIT,
    )
    lambda_s: float = setting(
        10.0, "weight of the labeled cross-entropy (eq. 4)", rule=POSITIVE, ref="FedMatch Table 4"
    )
    lambda_i: float = setting(
        1e-2, "weight of the inter-client KL (eq. 1; official lambda_i)", rule=NON_NEGATIVE
    )
    lambda_a: float = setting(
        1e-2,
        "weight of the agreement cross-entropy (eq. 2; official lambda_a)",
        rule=NON_NEGATIVE,
    )
    lambda_l1: float = setting(
        1e-5,
        "L1 on psi (eq. 5; Table 4: 1e-5 labels-at-server, 1e-4 at client)",
        rule=NON_NEGATIVE,
        ref="FedMatch Table 4",
    )
    lambda_l2: float = setting(
        10.0, "L2 between sigma and psi (eq. 5)", rule=NON_NEGATIVE, ref="FedMatch Table 4"
    )
    l1_threshold: float = setting(
        1e-5,
        "psi elements at or below are zeroed after local training (official; 5e-6 at client)",
        rule=NON_NEGATIVE,
    )
    delta: float = setting(
        1e-5,
        "sparse transmission: only elements that moved by more travel (official; 5e-5 at client)",
        rule=NON_NEGATIVE,
    )
    labeled_batch_size: int = setting(
        10, "labels-at-client labeled batch (official)", rule=between(1, MAX_BATCH)
    )


STATE_KEY = "fedmatch"


@functools.lru_cache(maxsize=4)
def randaugment(n: int, m: float, channels: int, device: str, engine: str) -> torch.nn.Module:
    """The RandAugment view pi(u) of eq. 2, built once per process."""
    return engine_class(engine, "randaugment")(n, m, channels).to(device)


@functools.lru_cache(maxsize=4)
def official_randaugment(channels: int, device: str, engine: str) -> torch.nn.Module:
    """pi(u) as the official code draws it (randaug.py, loader.py), built once per process."""
    return engine_class(engine, "official")(channels).to(device)


def strong_view(
    algo: FedMatchSettings, channels: int, device: str, engine: str = "kornia"
) -> torch.nn.Module:
    """The view pi(u) of eq. 2 that ``algo.strong_view`` names (``engine``:
    ``augment.engine``)."""
    if algo.strong_view == "official":
        return official_randaugment(channels, device, engine)
    return randaugment(algo.randaugment_n, algo.randaugment_m, channels, device, engine)


class FedMatchClient(ClientHalf):
    """Local FedMatch training of one client in one round (both scenarios)."""

    # One SGD per part, built every round (official code): no kept momentum, no proximal
    # term, epochs at one rate a round.
    honours = frozenset({"client.nesterov"})
    attacks: frozenset[str] = frozenset()  # its payload is sparse psi, not a dense model

    def build_model(self) -> Decomposed:
        net = model_for(self.settings.model, self.data)
        return Decomposed(net, self.algo.psi_factor, self.algo.decomposition).to(self.device)

    # ----- Receiving ------------------------------------------------------------------
    def held_copy(self, since: int) -> dict[str, torch.Tensor]:
        """The public copy kept from round ``since`` (none when the payload is dense)."""
        if since < 0:
            return {}
        record = self.state.get(STATE_KEY)
        held = int(record["round"].numpy()) if record is not None else None
        if held != since:
            raise ValueError(f"client holds the model of round {held}, the payload needs {since}")
        return {part: torch.from_numpy(record[part].numpy()) for part in self.model.parts()}

    def load_model(self) -> None:
        """Apply the payload to the kept copy, load it, keep the new copy in context.state."""
        arrays = {k: v.numpy() for k, v in self.content["arrays"].items()}
        held = self.held_copy(int(self.config["sync-since"]))
        n = self.model.numel()
        self.received = {
            part: decode(held.get(part), payload_from(arrays, part), n)
            for part in self.model.parts()
        }
        for part, vector in self.received.items():
            self.model.load_flat(part, vector)
        buffers = {k[len(BUFFER) :]: v for k, v in arrays.items() if k.startswith(BUFFER)}
        self.model.net.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in buffers.items()})
        self.state[STATE_KEY] = ArrayRecord(
            {**self.received, "round": torch.tensor(self.round, dtype=torch.int64)}
        )
        self.helpers = self.decode_helpers(arrays_of(self.content, "helpers"))

    def decode_helpers(self, arrays: dict[str, np.ndarray]) -> list[torch.Tensor]:
        """Helpers' unlabeled parts, sparse against the received one (eq. 1: frozen), decoded
        once and kept on the training device for every forward of the round."""
        count = len(self.config["helpers"]) if "helpers" in self.config else 0
        ref = self.received[self.model.unlabeled_part]
        n = self.model.numel()
        return [decode(ref, payload_from(arrays, f"h{j}"), n).to(self.device) for j in range(count)]

    # ----- Training -------------------------------------------------------------------
    def sgd(self, part: str) -> torch.optim.SGD:
        ccfg = self.settings.client
        return make_sgd(
            self.model.params(part),
            self.lr,
            ccfg.momentum,
            ccfg.weight_decay,
            ccfg.nesterov,
        )

    def train(self) -> dict[str, float]:
        d, ccfg, model = self.data, self.settings.client, self.model
        unlabeled = model.unlabeled_part
        opt_u = self.sgd(unlabeled)
        opt_s = self.sgd("sigma") if model.decomposed else opt_u
        seen = kept = 0
        sums = running_sum(self.device).expand(2).clone()  # confident and right, loss
        steps = 0
        model.train()
        algo = self.algo
        view = strong_view(algo, d.channels, str(self.device), self.engine())
        batches = (
            idx.to(d.x.device)
            for _ in range(ccfg.epochs)
            for idx in minibatches(len(d.x), ccfg.batch_size, self.generator)
        )
        for idx, views in augment_grouped(d.x, batches, view):
            if len(d.labeled_x):
                self.sigma_step(opt_s, steps)
            true_y = None if d.true_y is None else d.true_y[idx]
            confident, step_sums = self.unlabeled_step(opt_u, d.x[idx], views, true_y)
            seen, kept, sums = seen + len(idx), kept + confident, sums + step_sums
            steps += 1
        if model.decomposed:
            model.prune_psi(self.algo.l1_threshold)
        right, loss = sums.tolist()
        known = {} if d.true_y is None else {"pseudo_label_accuracy": right / max(kept, 1)}
        return {
            "train_loss": loss / max(steps, 1),
            "mask_rate": kept / max(seen, 1),
            **known,
            "helpers": float(len(self.helpers)),
            "dense-bytes": float(dense_model_bytes(model)),
        }

    def sigma_step(self, opt: torch.optim.Optimizer, step: int) -> None:
        """Eq. 4: lambda_s CE on one labeled batch (cycled), psi frozen."""
        d, model = self.data, self.model
        weak = self.weak_view()
        idx = cycled_batch(step, self.algo.labeled_batch_size, len(d.labeled_x), d.labeled_x.device)
        model.train_only("sigma")
        loss = self.algo.lambda_s * F.cross_entropy(model(weak(d.labeled_x[idx])), d.labeled_y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    def unlabeled_step(
        self,
        opt: torch.optim.Optimizer,
        xb: torch.Tensor,
        views: torch.Tensor,
        true_y: torch.Tensor | None,
    ) -> tuple[int, torch.Tensor]:
        """Eq. 5 on one unlabeled batch, sigma frozen; returns how many samples were
        confident and, on the device (float64), how many of those were right and the loss.

        ``views`` are the batch's RandAugment views pi(u), drawn ahead for the whole
        group (tasks.augment.augment_grouped); the confident ones are trained on. They are
        picked by index (one host sync a step, not a mask multiply): the forward on them
        alone sets BatchNorm's batch statistics, which a mask would change.

        ``true_y`` (hidden labels, for the diagnostics only) is None on a node that has
        unlabeled images alone."""
        algo, model = self.algo, self.model
        model.train_only(model.unlabeled_part)
        logits = model(xb)
        probs = torch.softmax(logits.detach(), dim=1)
        sel = torch.nonzero(probs.max(dim=1).values >= algo.confidence).squeeze(1)
        loss = logits.new_zeros(())
        if model.decomposed:
            loss = decomposition_penalty(
                model.params("sigma"), model.params("psi"), algo.lambda_l1, algo.lambda_l2
            )
        right = torch.zeros((), dtype=torch.int64, device=xb.device)
        if sel.numel():
            xs = xb[sel]
            helper_probs = [torch.softmax(model.forward_with(h, xs), dim=1) for h in self.helpers]
            labels = agreement_labels(probs[sel], helper_probs)
            loss = loss + algo.lambda_a * F.cross_entropy(model(views[sel]), labels)
            loss = loss + algo.lambda_i * inter_client_kl(helper_probs, logits[sel])
            if true_y is not None:
                right = (labels == true_y[sel]).sum()
        if loss.requires_grad:
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        return sel.numel(), torch.stack([right.double(), loss.detach().double()])

    # ----- Sending --------------------------------------------------------------------
    def reply_arrays(self) -> dict[str, ArrayRecord]:
        """The uploaded parts, sparse against the received model, and the buffers."""
        at_client = self.settings.split.scenario == "labels_at_client"
        delta = self.algo.delta
        out: dict[str, np.ndarray] = {}
        for part in uploaded_parts(self.model, at_client):
            payload = encode_changes(self.model.flat(part), self.received[part], delta)
            out.update(payload_arrays(payload, part))
        out.update(buffer_arrays(self.model))
        return {"arrays": ArrayRecord(array_dict={k: Array(v) for k, v in out.items()})}


def arrays_of(content, key: str) -> dict[str, np.ndarray]:
    """The numpy arrays of one ArrayRecord of a message (empty when absent)."""
    if key not in content.array_records:
        return {}
    return {k: v.numpy() for k, v in content[key].items()}
