"""``brisk train drafter``: a DFlash-shaped drafter trained on its target's regenerated
responses with one of the four weightings (:mod:`brisk.runtime.train.drafter.loss` has the loss).

One loop, read top to bottom: the target (frozen) and its dataset are checked against each
other, a new drafter is built for the target (its width, heads, rotary and vocabulary), and
each step draws ``batch_size`` responses, samples anchors among their tokens and takes an AdamW
step on the weighted loss, until ``token_budget`` drafted targets are trained. Checkpoints, resume
and the run-directory rules are those of the other training commands
(:mod:`brisk.runtime.train.resume`): ``checkpoint-<step>/`` holds the drafter, the optimizer,
the profile tracker, the data cursor and the RNG states; ``final/`` the drafter in the DFlash
format (``config.json`` + ``model.safetensors``) and ``train_config.json``; each is written
atomically; only a ``checkpoint-<step>/`` holds the trainer state (``trainer_state.pt``), not
``final/``. The drafter's MASK id is its target's
(:func:`~brisk.runtime.loader.checkpoint_mask_id`: ``mask_token_id``, else the target's own,
else the first embedding row no token uses, DFlash's choice). At the end the drafter decodes
``eval_problems`` held-out prompts of the dataset's task greedily with its target
(:mod:`brisk.runtime.train.drafter.evaluate`: a world's test split, or a user's file's rows the
dataset left out; a file with none is refused before the first step): tokens per target forward
and E[L], logged as the ``eval`` event.

Under ``torchrun --nproc-per-node P`` (gloo on CPU, nccl on GPU) it trains data parallel, as
``brisk train base`` and ``brisk train proposal`` do (:mod:`brisk.runtime.train.distributed`):
the drafter is replicated with DDP, or sharded with FSDP2 under ``fsdp`` (one unit: its layers'
context keys and values are computed before its blocks run, inside one forward,
:class:`~brisk.runtime.train.drafter.loss.DrafterStep`); the frozen target is a replica on every
rank's device. What does not depend on P (nor on ``micro_batch_size``): every rank draws the
same global batch from the data stream and the same anchors for it from the one CPU generator
(seeded with ``seed``), then runs rows ``rank::P`` of it, in micro-batches; so a run's data,
anchors and generator state are the same on any number of ranks. The loss is divided by the
global batch's trained targets (known from the anchors before any forward), the acceptance
counts are all-reduced before the tracker takes them, and under ``brisk`` weighting the step's
own profile sets its weights, as in one process: with one micro-batch per rank the counts are
all-reduced between its forward and its backward; with several each micro-batch is first
forwarded without gradients to count them. So a step on P ranks is the one-process step on the
whole batch up to float summation order (``tests/runtime/test_drafter_fsdp.py``). Rank 0 writes
``metrics.jsonl``, the checkpoints (under FSDP every rank writes its model and optimizer shards
into the checkpoint's ``sharded/`` with DCP, rank 0 the gathered plain drafter beside them) and
runs the final evaluation; the saved drafter is always the plain DFlash checkpoint. ``resume``
continues from the newest checkpoint, bit-identical to an uninterrupted run on CPU in one
process; under torchrun it continues from the checkpoint (FSDP shards are resharded by DCP, so
the world size may change). SIGINT or SIGTERM stops every rank at the same step (the flag is
all-reduced) with a checkpoint of that step.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any, cast

import torch

from brisk.runtime.drafter import DFlashDrafter, drafter_config, load_drafter, write_drafter
from brisk.runtime.loader import load_target
from brisk.runtime.train.common import adamw
from brisk.runtime.train.distributed import Dist, Precision, autocast, grad_sync, micro_batches
from brisk.runtime.train.drafter.config import DrafterTrainConfig
from brisk.runtime.train.drafter.evaluate import evaluate_drafter, task_prompts
from brisk.runtime.train.drafter.features import TargetFeatures
from brisk.runtime.train.drafter.loss import (
    BlockLosses,
    Blocks,
    DrafterStep,
    accept_histogram,
    block_losses,
    histogram_profile,
    make_blocks,
    position_weights,
    sample_anchors,
)
from brisk.runtime.train.evaluate import encode_example
from brisk.runtime.train.harness import Recipe, Run, StepRecord, TrainResult, train
from brisk.runtime.train.proposal.data import Example, ExampleStream, dataset_examples
from brisk.runtime.train.selfgen import (
    checkpoint_hash,
    read_provenance,
    tokenizer_hash,
)
from brisk.theory import ProfileTracker

__all__ = ["DrafterRecipe", "train_drafter"]

CONFIG_FILE = "train_config.json"
# a micro-batch: its ids, its blocks and (with a feature cache) its target features
Chunk = tuple[torch.Tensor, Blocks, torch.Tensor | None]


def _examples(cfg: DrafterTrainConfig) -> list[Example]:
    """The dataset's responses, checked to be the target's own."""
    if not cfg.dataset:
        raise ValueError("--dataset: drafter training needs the target's regenerated responses")
    provenance = read_provenance(cfg.dataset)
    if provenance["tokenizer_hash"] != tokenizer_hash(cfg.target):
        raise ValueError(f"--dataset: {cfg.dataset} was made with another tokenizer than --target")
    if provenance.get("checkpoint_hash") != checkpoint_hash(cfg.target):
        raise ValueError(
            f"--dataset: {cfg.dataset} was regenerated by another target "
            f"({provenance['checkpoint']}) than --target {cfg.target} "
            f"(brisk train selfgen --checkpoint {cfg.target})"
        )
    return dataset_examples(cfg.dataset, every=cfg.data == "selfgen-all")


def train_drafter(
    cfg: DrafterTrainConfig, show_progress: bool = True, *, resume: bool = True
) -> TrainResult[dict[str, Any] | None]:
    """Train into ``cfg.out_dir`` through the harness (module docstring;
    :func:`~brisk.runtime.train.harness.train`: resume by default, SIGINT or SIGTERM ends it with
    a checkpoint); the outcome is the held-out evaluation (None without held-out prompts)."""
    return train(DrafterRecipe(cfg), show_progress, resume=resume)


class DrafterRecipe(Recipe[DrafterTrainConfig, dict[str, Any] | None]):
    """A drafter against its frozen target, each step on anchors sampled in a batch of the
    target's responses, counted in trained targets (module docstring)."""

    unit = "tokens"

    def __init__(self, cfg: DrafterTrainConfig) -> None:
        super().__init__(cfg)
        self.label = f"drafter {cfg.weighting}"
        self.tracker = ProfileTracker(cfg.M, cfg.profile_decay)
        self.generator = torch.Generator().manual_seed(cfg.seed)  # the anchors' draws (CPU)

    def build(self, run: Run) -> None:
        cfg, device = self.cfg, run.device
        self.target, self.tokenizer, self.mask_id = load_target(
            cfg.target, device=device, mask_token_id=cfg.mask_token_id
        )
        self.examples = _examples(cfg)
        try:  # the held-out prompts, or why there are none: before the first step
            n = cfg.eval_problems
            self.held_out = task_prompts(cfg.dataset, n, self.tokenizer) if n else []
        except ValueError as err:
            raise ValueError(f"--eval-problems: {str(err).removeprefix('dataset: ')}") from None
        self.limit = self.target.config.max_position_embeddings
        torch.manual_seed(cfg.seed)  # the drafter's initial weights: the same on every rank
        random.seed(cfg.seed)
        if run.start is not None:
            self.drafter = load_drafter(run.start, device=device)
        else:
            config = drafter_config(
                self.target.config,
                num_layers=cfg.num_layers,
                block_size=cfg.block_size,
                mask_token_id=self.mask_id,
                target_layer_ids=list(cfg.target_layer_ids) or None,
            )
            self.drafter = DFlashDrafter(config)
        self.drafter.to(device)
        self.cache = _feature_cache(
            cfg, self.examples, self.tokenizer, self.target, self.drafter, self.limit, run
        )
        step = DrafterStep(self.drafter, cfg.activation_checkpointing)
        self.model = _prepare(step, run.dist, cfg, run.precision)  # what a step calls
        # after sharding: DTensors under FSDP
        self.optimizer = adamw(self.drafter, cfg.lr, cfg.weight_decay)
        self.stream = ExampleStream(self.examples, cfg.seed)
        # bf16: the frozen target computes under autocast too (it has no master weights)
        self.precision = autocast(cast(Precision, run.precision), False, device)
        self.mine = run.dist.rows(cfg.batch_size)  # this rank's rows of every global batch

    def state_dict(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "tracker": self.tracker.state_dict(),
            "cursor": self.stream.cursor,
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.tracker.load_state_dict(state["tracker"])
        self.stream = ExampleStream(self.examples, self.cfg.seed, **state["cursor"])
        self.generator.set_state(state["generator"])
        self.tokens = state["tokens"]

    def begin(self, run: Run) -> None:
        self.model.train()

    def step(self, run: Run, step: int) -> StepRecord:
        cfg, dist, M, tracker = self.cfg, run.dist, self.cfg.M, self.tracker
        # The global batch and its anchors, the same on every rank; this rank's rows of it, in
        # micro-batches, each cut to its longest row.
        taken = self.stream.take(cfg.batch_size)
        ids, supervised, lengths = _batch(taken, self.tokenizer, self.limit)
        a, keep = sample_anchors(supervised, cfg.anchors, self.generator)
        blocks = make_blocks(ids, supervised, a, keep, M, self.mask_id)
        count = int(blocks.valid.sum())  # the global batch's trained targets
        rows = list(range(cfg.batch_size))[self.mine]
        chunks = [
            _chunk(ids, blocks, part, lengths, run.device, self.cache, [taken[r][0] for r in part])
            for part in micro_batches(rows, cfg.micro_batch_size)
        ]
        lr = cfg.lr_at(self.tokens / cfg.token_budget)
        for group in self.optimizer.param_groups:
            group["lr"] = lr

        def forward(chunk: Chunk) -> BlockLosses:
            with self.precision:
                return block_losses(self.target, self.drafter, self.model, *chunk)

        # brisk weights come from the tracker once it holds this step's acceptance
        # (all-reduced): several micro-batches are counted by a forward without gradients
        # first, a single one between its forward and its backward.
        brisk = cfg.weighting == "brisk"
        probe = brisk and len(chunks) > 1
        if probe:
            counted = torch.zeros(M + 1, dtype=torch.float64)
            with torch.no_grad():
                for chunk in chunks:
                    counted += accept_histogram(forward(chunk).lengths, M)
            tracker.update(histogram_profile(dist.sum(counted), M))

        # Each micro-batch's share of Σ w·CE / (global trained targets); gradients are reduced
        # across ranks once, after the last micro-batch.
        self.optimizer.zero_grad(set_to_none=True)
        local = torch.zeros(1 + 3 * M + M + 1, dtype=torch.float64)
        for k, chunk in enumerate(chunks):
            with grad_sync(self.model, k == len(chunks) - 1):
                losses = forward(chunk)
                histogram = accept_histogram(losses.lengths, M)
                if brisk and not probe:
                    tracker.update(histogram_profile(dist.sum(histogram), M))
                w = position_weights(
                    cfg.weighting, losses, tracker=tracker, alpha=cfg.alpha, gamma=cfg.gamma
                )
                vf = losses.valid.to(losses.ce.dtype)
                share = (w * losses.ce * vf).sum()
                loss: Any = dist.world * (share / max(count, 1))
                loss.backward()
            local += _stats(share, losses, vf, w, histogram)
        torch.nn.utils.clip_grad_norm_(self.drafter.parameters(), cfg.grad_clip)
        self.optimizer.step()
        summed = dist.sum(local)
        if not brisk:  # the weights did not need it: the step's profile, for the log
            tracker.update(histogram_profile(summed[1 + 3 * M :], M))
        self.tokens += count
        loss_value = float(summed[0]) / max(count, 1)
        ce_sums, trained, weight_sums = summed[1 : 1 + 3 * M].view(3, M)
        blocks_n = cfg.batch_size * blocks.anchors.shape[1]
        fields = {
            "tokens": self.tokens,
            "lr": lr,
            "loss": loss_value,
            "ce": (ce_sums / trained.clamp(min=1)).tolist(),
            "weights": (weight_sums / blocks_n).tolist(),
            "accept_rates": tracker.posterior_mean().tolist(),
        }
        return StepRecord(fields, f"loss {loss_value:.3f}")

    def write(self, directory: Path, weights: dict[str, torch.Tensor] | None) -> None:
        plain = self.drafter if weights is None else _plain(self.drafter, weights)
        write_drafter(plain, directory)
        (directory / CONFIG_FILE).write_text(json.dumps(self.cfg.to_dict(), indent=2))

    def finish(self, run: Run, final: Path) -> dict[str, Any] | None:
        """Rank 0 decodes the held-out prompts greedily with the plain drafter (under FSDP:
        the one just saved) and its target."""
        self.model.eval()
        if run.dist.rank != 0 or not self.held_out:
            return None
        plain = load_drafter(final, device=run.device) if self.cfg.fsdp else self.drafter
        evaluation = evaluate_drafter(
            self.held_out, self.target, self.tokenizer, plain.eval(), self.cfg.eval_max_new_tokens
        )
        run.log({"event": "eval", "step": run.step, **evaluation})
        return evaluation


def _feature_cache(
    cfg: DrafterTrainConfig,
    examples: list[Example],
    tokenizer: Any,
    target: Any,
    drafter: DFlashDrafter,
    limit: int,
    run: Run,
) -> TargetFeatures | None:
    """The target's features of every example (``cfg.feature_cache``; None without one): built
    by rank 0 when absent while the other ranks wait, then opened by every rank."""
    if not cfg.feature_cache:
        return None
    sequences = [encode_example(ex.prompt, ex.response, tokenizer)[0][:limit] for ex in examples]
    ids = hashlib.sha256(json.dumps(sequences).encode()).hexdigest()[:16]
    layers = list(drafter.spec.target_layer_ids)
    parts = {
        "target": checkpoint_hash(cfg.target),
        "tokenizer": tokenizer_hash(cfg.target),
        "layer_ids": layers,
        "limit": limit,
        "examples": len(sequences),
        "ids": ids,
    }
    root = Path(cfg.feature_cache)
    if run.dist.rank == 0:
        TargetFeatures.open_or_build(
            root, parts, sequences, target, layers, show_progress=run.show_progress
        )
    run.dist.barrier()
    return TargetFeatures.open_or_build(root, parts, sequences, target, layers, build=False)


def _chunk(
    ids: torch.Tensor,
    blocks: Blocks,
    rows: Sequence[int],
    lengths: list[int],
    device: torch.device,
    cache: TargetFeatures | None,
    draws: Sequence[int],
) -> Chunk:
    """:func:`_rows` and, with a cache, the rows' target features cut as their ids are (the
    stream numbers its draws across epochs: draw ``k`` is example ``k mod n``)."""
    chunk_ids, chunk_blocks = _rows(ids, blocks, rows, lengths, device)
    if cache is None:
        return chunk_ids, chunk_blocks, None
    held = [k % len(cache) for k in draws]
    return chunk_ids, chunk_blocks, cache.batch(held, chunk_ids.shape[1], device)


def _prepare(step: DrafterStep, dist: Dist, cfg: DrafterTrainConfig, precision: str) -> Any:
    """The module a training step calls: ``step`` sharded with FSDP2 (one unit; bf16 compute
    with fp32 reductions under ``precision = "bf16"``) or wrapped in DDP when ``dist`` has
    several ranks, else ``step`` itself (:func:`~brisk.runtime.train.distributed.prepare` for a
    module without a decoder stack: the drafter's layers are not called one by one)."""
    if cfg.fsdp:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        policy = MixedPrecisionPolicy(
            param_dtype=torch.bfloat16 if precision == "bf16" else None,
            reduce_dtype=torch.float32,
        )
        fully_shard(step, mp_policy=policy)
        return step
    if dist.world > 1:
        return torch.nn.parallel.DistributedDataParallel(step)
    return step


def _plain(drafter: DFlashDrafter, weights: dict[str, torch.Tensor]) -> DFlashDrafter:
    """A plain drafter holding the gathered ``weights`` of a sharded :class:`DrafterStep`
    (what :func:`save_drafter` writes), built without storage or random draws."""
    with torch.device("meta"):
        plain = DFlashDrafter(drafter.config)
    prefix = "drafter."
    plain.load_state_dict({k.removeprefix(prefix): v for k, v in weights.items()}, assign=True)
    return plain


def _rows(
    ids: torch.Tensor,
    blocks: Blocks,
    rows: Sequence[int],
    lengths: list[int],
    device: torch.device,
) -> tuple[torch.Tensor, Blocks]:
    """Rows ``rows`` of a global batch's ids and blocks on ``device``, the ids cut to the
    longest of these rows (no anchor and no trained target lies beyond it)."""
    index = torch.as_tensor(rows)
    S = max(lengths[r] for r in rows)
    picked = {f.name: getattr(blocks, f.name)[index].to(device) for f in fields(Blocks)}
    return ids[index, :S].to(device), Blocks(**picked)


def _stats(
    share: torch.Tensor, losses: BlockLosses, vf: torch.Tensor, w: torch.Tensor, hist: torch.Tensor
) -> torch.Tensor:
    """A micro-batch's sums for the log, float64 on the CPU: Σ w·CE, then per position the CE
    sum, the trained targets and the weights summed over its blocks, then its accept
    histogram (summed over micro-batches and ranks, they give the global batch's means)."""
    M = losses.ce.shape[-1]
    blocks = losses.ce.shape[0] * losses.ce.shape[1]
    with torch.no_grad():
        weight_sums = w.reshape(-1, M).sum(0) if w.ndim > 1 else w * blocks
        parts = [
            share.detach().reshape(1),
            (losses.ce.detach() * vf).sum((0, 1)),
            vf.sum((0, 1)),
            weight_sums,
        ]
        return torch.cat([p.double().cpu() for p in parts] + [hist])


def _batch(
    rows: list[tuple[int, Example]], tokenizer: Any, limit: int
) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Right-padded ids ``[B, S]`` of ``[bos, prompt, response, eos]``, the mask of the
    response tokens (EOS included) and each row's length, each cut to the target's positions."""
    encoded = [encode_example(ex.prompt, ex.response, tokenizer) for _, ex in rows]
    seqs = [(s[:limit], n) for s, n in encoded]
    S = max(len(s) for s, _ in seqs)
    ids = torch.full((len(seqs), S), tokenizer.pad_token_id or 0, dtype=torch.long)
    supervised = torch.zeros(len(seqs), S, dtype=torch.bool)
    for b, (s, n) in enumerate(seqs):
        ids[b, : len(s)] = torch.as_tensor(s)
        supervised[b, n : len(s)] = True
    return ids, supervised, [len(s) for s, _ in seqs]
