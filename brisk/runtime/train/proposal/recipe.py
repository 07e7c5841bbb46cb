"""Risk–reward proposal training (``brisk train proposal``): continued I-DLM training in which
the M proposal (MASK-stream) losses are weighted per position (eq:brisk_weighting):

    L = Σ_j w̄_{i(j)} ℓ_j / n_noisy + α · CE_clean,

a token mean over the MASK slots j with a label (i(j) the slot's proposal position), which is
(1/M) Σ_i w̄_i L_i^prop when every position has the same count and the plain I-DLM loss when
w̄ ≡ 1. The weights are constants in backprop. With ``weights = "brisk"`` they are
``progress_weights`` (ISD cost model) of the acceptance profile: ``dynamic`` re-estimates it at
every step from the batch's own proposals under the ISD rule
(:mod:`brisk.runtime.train.proposal.acceptance`) and tracks it with :class:`ProfileTracker`;
``static`` estimates it once, on ``static_batches`` batches of the training data, before the
first step. The profile used is the tracker's Jeffreys posterior mean
(accepted + ½)/(reached + 1), which has no 0/0 at an unreached position.

Memory at the users' scale: every micro-batch is forwarded once, to its last hidden states, and
the losses and each MASK slot's acceptance probability come from the LM head applied in chunks
(:func:`~brisk.runtime.train.vocab.stream_losses`): no ``[B, 2L, V]`` logits. A step's loss is
divided by the global batch's label counts, known before any forward; its profile and its α
(``alpha = "auto"``: CE_noisy / CE_clean) are the ones measured up to the previous step — the
tracker folds each step's verdicts in after the step, and the first step takes them from a
probe of its own batch without gradients. Measuring them on the step's own batch would need
every micro-batch forwarded twice (once to measure, once to backpropagate with weights known),
or all of them held in memory.

One loop, read top to bottom. Under ``torchrun --nproc-per-node P`` (gloo on CPU, nccl on GPU)
every rank takes rows ``rank::P`` of the same global batch and the model is wrapped in DDP; the
loss is divided by the *global* token counts (all-reduced), the acceptance counts are
all-reduced, so every rank uses the same weights and the run matches a single process at the
same global batch, split into any number of micro-batches, up to float summation order. Rank 0
writes ``metrics.jsonl`` (one record per step: weights, profile, losses), checkpoints and
``weights.png``.

Checkpoints (``checkpoint-NNNNNN/`` every ``save_every`` steps and ``final/``) hold the model
(safetensors + HF config, which records the run's MASK id: ``mask_token_id`` or the row
``add_mask_token`` adds to an ``init`` without one), tokenizer, the base run's
``train_config.json`` and this run's ``proposal_config.json``; a ``checkpoint-NNNNNN/`` also
holds ``trainer_state.pt`` (optimizer, step, tokens seen, data cursor, profile tracker, RNG
states, the size of ``metrics.jsonl``), which ``final/`` does not (a finished run is never
resumed); each is written to a temporary directory and renamed. SIGINT or SIGTERM stops the
run between steps with a checkpoint of the step it reached; under torchrun the ranks
all-reduce their stop flag at every step, so all stop at the same step, rank 0 saves while the
others wait. ``resume`` continues from the newest
checkpoint and ends bit-identical to an uninterrupted run on CPU; the rules of a run directory
(a used one is refused without ``resume``, another configuration is named) are those of
:mod:`brisk.runtime.train.resume`.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from brisk.runtime.train.common import adamw, carry_mask, init_tokens
from brisk.runtime.train.distributed import autocast, grad_sync, load_for_training, micro_batches
from brisk.runtime.train.forward import set_attention, training_forward
from brisk.runtime.train.harness import Recipe, Run, StepRecord, TrainResult, train
from brisk.runtime.train.idlm import (
    IDLMBatch,
    auto_alpha,
    label_counts,
    loss_totals,
    weighted_loss,
)
from brisk.runtime.train.proposal.acceptance import (
    acceptance_histogram,
    profile_counts,
    slot_weight_sums,
    token_weights,
    upcoming_profile,
)
from brisk.runtime.train.proposal.config import ProposalTrainConfig
from brisk.runtime.train.proposal.data import (
    Example,
    ExampleStream,
    check_lengths,
    example_batch,
    load_examples,
)
from brisk.runtime.train.resume import METRICS, latest_checkpoint
from brisk.runtime.train.vocab import stream_losses
from brisk.theory import AcceptanceProfile, ProfileTracker

__all__ = [
    "ProposalRecipe",
    "latest_checkpoint",
    "loss_totals",
    "train_proposal",
    "weighted_loss",
]


def train_proposal(
    cfg: ProposalTrainConfig, *, resume: bool = True, show_progress: bool = True
) -> TrainResult[int]:
    """Train (or continue) a proposal model through the harness
    (:func:`~brisk.runtime.train.harness.train`: resume by default, SIGINT or SIGTERM ends it
    with a checkpoint); see the module docstring. The outcome is the tokens trained."""
    return train(ProposalRecipe(cfg), show_progress, resume=resume)


class ProposalRecipe(Recipe[ProposalTrainConfig, int]):
    """Continued I-DLM training with the proposal losses weighted per position (module
    docstring), counted in trained tokens."""

    unit = "tokens"
    config_file = "proposal_config.json"

    def __init__(self, cfg: ProposalTrainConfig) -> None:
        super().__init__(cfg)
        self.label = f"proposal {cfg.data} {cfg.weights}/{cfg.profile}"
        self.static_rates: list[float] | None = None
        self.upcoming: dict[str, Any] | None = None  # the next step's profile and α
        self.tracker = ProfileTracker(cfg.M, cfg.profile_decay)

    def build(self, run: Run) -> None:
        from brisk.runtime.architectures import load_causal_lm

        cfg = self.cfg
        self.examples = load_examples(cfg)
        # A MASK id that cannot be is refused before any write.
        init = init_tokens(cfg.init, cfg)
        self.tokenizer, self.ids = init.tokenizer, (init.mask_id, init.pad_id)

        # The init checkpoint, or the newest checkpoint of this run; under FSDP rank 0 alone
        # reads the weights, the others receive their shards.
        def build() -> Any:
            model = load_causal_lm(run.start or cfg.init, False, torch.float32)
            carry_mask(model, init, cfg.add_mask_token)
            return model

        self.model, self.net = load_for_training(
            build,
            run.dist,
            fsdp=cfg.fsdp,
            precision=run.precision,
            checkpointing=cfg.activation_checkpointing,
            device=run.device,
        )
        check_lengths(self.examples, self.tokenizer, self.model.config, cfg.dataset)
        set_attention(self.model, cfg.attention)  # not saved with the model: checkpoints stay plain
        self.optimizer = adamw(self.model, cfg.lr, cfg.weight_decay)
        self.stream = ExampleStream(self.examples, cfg.seed)
        self.precision = autocast(run.precision, cfg.fsdp, run.device)
        self.head = self.model.get_output_embeddings()
        self.mine = run.dist.rows(cfg.batch_size)  # this rank's rows of every global batch

    def state_dict(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "static_rates": self.static_rates,
            "cursor": self.stream.cursor,
            "tracker": self.tracker.state_dict(),
            "upcoming": self.upcoming,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.tokens, self.static_rates = state["tokens"], state["static_rates"]
        self.stream = ExampleStream(self.examples, self.cfg.seed, **state["cursor"])
        self.tracker.load_state_dict(state["tracker"])
        self.upcoming = state.get("upcoming")

    def begin(self, run: Run) -> None:
        # Static profile: the initial model's acceptance on a few batches of the training data.
        cfg = self.cfg
        if cfg.weights == "brisk" and cfg.profile == "static" and self.static_rates is None:
            draws = ExampleStream(self.examples, cfg.seed + 1)
            batches = [
                (rows, example_batch(cfg, rows, self.tokenizer, -1 - k, run.device, self.ids))
                for k in range(cfg.static_batches)
                for rows in micro_batches(
                    draws.take(cfg.batch_size)[self.mine], cfg.micro_batch_size
                )
            ]
            reached, accepted, _ = profile_counts(self.probe(run, batches)[: cfg.M + 1], cfg.M)
            self.static_rates = AcceptanceProfile(reached, accepted).posterior_mean().tolist()
        self.model.train()

    def measure(self, batch: IDLMBatch, rows: Sequence[tuple[int, Example]]) -> tuple[Any, Tensor]:
        """One forward: the micro-batch's per-position losses (with their graph, when
        gradients are on) and its accept-length histogram and loss totals ``[M + 1 + 4]``."""
        cfg = self.cfg
        with self.precision:
            h_noisy, h_clean = training_forward(self.net, batch, cfg.attention, hidden=True)
            losses = stream_losses(
                h_noisy,
                h_clean,
                self.head.weight,
                batch,
                temperature=cfg.temperature,
                top_k=cfg.top_k,
            )
        return losses, torch.cat(
            [acceptance_histogram(losses.beta, batch, rows, cfg), losses.totals(batch)]
        )

    def probe(self, run: Run, batches: Sequence[tuple[Sequence[Any], IDLMBatch]]) -> Tensor:
        """Histogram and totals of batches, summed over ranks, without gradients."""
        local = torch.zeros(self.cfg.M + 1 + 4, dtype=torch.float64)
        with torch.no_grad():
            for rows, batch in batches:
                local += self.measure(batch, rows)[1]
        return run.dist.sum(local)

    def step(self, run: Run, step: int) -> StepRecord:
        cfg, dist, M = self.cfg, run.dist, self.cfg.M
        # This rank's rows of the global batch, in micro-batches laid out in blocks of M. Every
        # micro-batch is forwarded once: the step's loss is divided by the global batch's label
        # counts (known before any forward), and α and the profile its weights come from are
        # those measured up to the previous step (module docstring), so the step is the same
        # whatever the number of ranks and micro-batches.
        chunks = micro_batches(self.stream.take(cfg.batch_size)[self.mine], cfg.micro_batch_size)
        batches = [
            (rows, example_batch(cfg, rows, self.tokenizer, step, run.device, self.ids))
            for rows in chunks
        ]
        lr = cfg.lr_at(self.tokens / cfg.token_budget)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        counts = dist.sum(torch.stack([label_counts(b) for _, b in batches]).sum(0))
        n_noisy, n_clean = max(float(counts[0]), 1.0), max(float(counts[1]), 1.0)
        if self.upcoming is None:  # the first step: α and the profile from a probe of its batch
            fresh = ProfileTracker(M, cfg.profile_decay)
            self.upcoming = upcoming_profile(fresh, self.probe(run, batches), M)
        rates = np.asarray(self.upcoming["rates"])
        if cfg.profile == "static" and self.static_rates is not None:
            rates = np.asarray(self.static_rates)
        a = self.upcoming["alpha"] if cfg.alpha == "auto" else float(cfg.alpha)

        # Each micro-batch's share of Σ w ℓ / n_noisy + α Σ ℓ_clean / n_clean, from its one
        # forward; gradients are reduced across ranks once, after the last.
        self.optimizer.zero_grad(set_to_none=True)
        local = torch.zeros(M + 1 + 4, dtype=torch.float64)  # histogram, loss totals
        weighted = torch.zeros((), dtype=torch.float64)
        slots = torch.zeros(2, M, dtype=torch.float64)
        for k, (rows, batch) in enumerate(batches):
            with grad_sync(self.net, k == len(batches) - 1):
                losses, stats = self.measure(batch, rows)
                token_w = token_weights(cfg, batch, losses.noisy.detach(), rates)
                share = (token_w * losses.noisy).sum()
                loss = dist.world * (share / n_noisy + a * losses.clean.sum() / n_clean)
                loss.backward()
            local += stats
            weighted += share.detach().double().cpu()
            slots += slot_weight_sums(batch, token_w)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        self.optimizer.step()

        # Profile and α for the next step: this batch's own proposals verified under the ISD
        # rule, folded into the tracker; the CE ratio of this batch.
        summed = dist.sum(torch.cat([local, slots.flatten(), weighted[None]]))
        reached, accepted, hist = profile_counts(summed[: M + 1], M)
        self.tracker.update(AcceptanceProfile(reached, accepted))
        plain_g, clean_g, _, _ = summed[M + 1 : M + 5].tolist()
        self.upcoming = {
            "rates": self.tracker.posterior_mean().tolist(),
            "alpha": auto_alpha(plain_g / n_noisy, clean_g / n_clean),
        }
        self.tokens += int(n_clean)
        counts_w = summed[M + 5 :]
        slot_counts, weight_sums = counts_w[:M], counts_w[M : 2 * M]
        ce_noisy = float(counts_w[-1]) / n_noisy
        loss_value = ce_noisy + a * clean_g / n_clean

        # What the weights were computed from, and what they were.
        fields = {
            "tokens": self.tokens,
            "lr": lr,
            "loss": loss_value,
            "ce_noisy": ce_noisy,
            "ce_noisy_plain": plain_g / n_noisy,
            "ce_clean": clean_g / n_clean,
            "alpha": a,
            "weights": (weight_sums / slot_counts.clamp(min=1)).tolist(),
            "profile": rates.tolist(),
            "batch_reached": reached.tolist(),
            "batch_accepted": accepted.tolist(),
            "accept_hist": hist.tolist(),
        }
        return StepRecord(fields, f"loss {loss_value:.3f}")

    def write(self, directory: Path, weights: dict[str, Tensor] | None) -> None:
        self.model.save_pretrained(directory, state_dict=weights)
        self.tokenizer.save_pretrained(directory)
        world = Path(self.cfg.init) / "train_config.json"  # a brisk base's world travels with it
        if world.is_file():
            shutil.copy(world, directory / "train_config.json")
        (directory / self.config_file).write_text(json.dumps(self.cfg.to_dict(), indent=2))

    def finish(self, run: Run, final: Path) -> int:
        if run.dist.rank == 0:
            from brisk.runtime.train.plots import plot_weight_evolution

            plot_weight_evolution(run.out / METRICS, run.out / "weights.png")
        return self.tokens
