"""The prefix-conditioned corrector head (paper, sec:inference_head and app:head_implementation).

The backbone proposes all M positions in parallel; the corrector reranks each position's Top-K
candidates of the base proposal q sequentially, conditioning on the tokens it already chose in
the block. It reuses the backbone's MASK-slot hidden states, the anchor hidden state, the frozen
input embedding E and LM head E_out — no extra backbone forward. The math of one block lives in
:mod:`brisk.runtime.kernels.corrector_step.naive`; this module owns the parameters, the parallel
projections, teacher-forced training and inference-time selection.
"""

from __future__ import annotations

import json
import weakref
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from brisk._atomic import atomic_write
from brisk.runtime.backbone import Backbone
from brisk.runtime.checkpoint import check_shapes, tensor_shapes
from brisk.runtime.kernels.corrector_step import (
    IMPLS,
    N_FEATURES,
    CorrectorInputs,
    SelectOutput,
    StepInputs,
    StepWeights,
    select,
)

__all__ = ["Corrector", "CorrectorConfig", "CorrectorInputs", "CorrectorSelection"]

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
FORMAT = "brisk-corrector"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class CorrectorConfig:
    """Sizes of the head. Defaults are the paper's (tab:head_implementation_details), at
    Qwen3-8B sizes."""

    hidden_size: int = 4096  # backbone hidden size H
    vocab_size: int = 151936  # backbone vocabulary V
    M: int = 7  # proposal positions (stride N = M + 1)
    K: int = 16  # candidates per position
    state_dim: int = 128  # minimal-GRU state
    hidden_proj_dim: int = 64  # projection of the MASK hidden state
    token_proj_dim: int = 64  # projection of the previous token's embedding
    pos_dim: int = 16  # position embedding
    feature_dim: int = 16  # projection of the 5 confidence features
    rank: int = 64  # rank of the candidate residual
    init_identity: bool = True  # zero W_s so an untrained head keeps the base ranking
    prefix_feedback: bool = True  # feed x_{j−1} back (False: the position-wise ablation)

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "int" and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{f.name}: must be a positive integer, got {value!r}")
        if self.vocab_size < self.K:
            raise ValueError(f"K: {self.K} candidates exceed the vocabulary ({self.vocab_size})")

    @property
    def input_dim(self) -> int:
        """Width of the recurrent input [P_m m ‖ P_e E(x) ‖ pos ‖ P_φ φ] (160 in the paper)."""
        return self.hidden_proj_dim + self.token_proj_dim + self.pos_dim + self.feature_dim

    @classmethod
    def paper(
        cls, hidden_size: int = 4096, vocab_size: int = 151936, M: int = 7
    ) -> CorrectorConfig:
        """The paper's head: K = 16, state 128, projections 64/64/16/16, rank 64."""
        return cls(hidden_size=hidden_size, vocab_size=vocab_size, M=M)

    @classmethod
    def for_backbone(cls, backbone: Backbone, M: int, **overrides: Any) -> CorrectorConfig:
        """The paper's head sized for ``backbone``."""
        return cls(
            hidden_size=backbone.hidden_size, vocab_size=backbone.vocab_size, M=M, **overrides
        )

    @classmethod
    def small(cls, hidden_size: int, vocab_size: int, M: int, K: int = 8) -> CorrectorConfig:
        """A narrow head for tests and the tiny world."""
        return cls(
            hidden_size=hidden_size,
            vocab_size=vocab_size,
            M=M,
            K=K,
            state_dim=32,
            hidden_proj_dim=16,
            token_proj_dim=16,
            pos_dim=8,
            feature_dim=8,
            rank=16,
        )


@dataclass(frozen=True)
class CorrectorSelection:
    """One block chosen by the head. Shapes ``[B, M]`` and ``[B, M, K]``."""

    tokens: Tensor  # x_j
    ranks: Tensor  # index of x_j in C_j
    cand_ids: Tensor  # C_j, by base logit descending
    cand_logits: Tensor  # base logits ℓ_j(c_k)
    probs: Tensor  # softmax(ℓ̃_j / T) over C_j: the proposal law π_j when sampling
    refined: Tensor  # ℓ̃_j


class Corrector(nn.Module):
    """Minimal-GRU reranker over Top-K candidates, gated rank-R residual (eq:candidate_residual).

    ``impl`` chooses the sequential loop at inference (``"auto"``: the fused Triton kernel on
    CUDA, the naive loop elsewhere; see :func:`brisk.runtime.kernels.corrector_step.select`).
    Inference reads the candidates' projected rows from two tables folded once per backbone,
    P_e·E ``[V, D_e]`` and W_c·E_out ``[V, R]`` (:meth:`tables`), instead of gathering
    ``[B, M, K, H]`` rows of E and E_out every round; training projects the gathered rows, so
    gradients reach P_e and W_c.
    """

    impl: str = "auto"
    fold_tables: bool = True  # False: project gathered E / E_out rows every round (benchmarks)

    def __init__(self, config: CorrectorConfig) -> None:
        super().__init__()
        self.config = c = config
        H, S = c.hidden_size, c.state_dim
        self.hidden_proj = nn.Linear(H, c.hidden_proj_dim, bias=False)  # P_m
        self.token_proj = nn.Linear(H, c.token_proj_dim, bias=False)  # P_e
        self.pos_emb = nn.Embedding(c.M, c.pos_dim)
        self.feat_proj = nn.Linear(N_FEATURES, c.feature_dim)  # P_φ
        self.init_state = nn.Linear(2 * H, S, bias=False)  # Init_ψ(h_c, E(x_0))
        self.w_z = nn.Linear(c.input_dim, S, bias=False)
        self.w_h = nn.Linear(c.input_dim, S, bias=False)
        self.w_s = nn.Linear(S, c.rank, bias=False)
        self.w_c = nn.Linear(H, c.rank, bias=False)
        self.gate = nn.Linear(S + N_FEATURES, 1)  # w_g, b_g
        self.alpha = nn.Parameter(torch.zeros(()))
        if c.init_identity:
            nn.init.zeros_(self.w_s.weight)

    def step_weights(self) -> StepWeights:
        return StepWeights(
            pos_emb=self.pos_emb.weight,
            feat_w=self.feat_proj.weight,
            feat_b=self.feat_proj.bias,
            w_z=self.w_z.weight,
            w_h=self.w_h.weight,
            w_s=self.w_s.weight,
            gate_w=self.gate.weight[0],
            gate_b=self.gate.bias[0],
            alpha=self.alpha,
        )

    @torch.no_grad()
    def tables(self, backbone: Backbone, chunk: int = 16384) -> tuple[Tensor, Tensor]:
        """The folded tables (P_e·E ``[V, D_e]``, W_c·E_out ``[V, R]``) for ``backbone``, computed
        once and reused until the head's weights (through their optimizer updates or
        ``load_state_dict``) or the backbone object change. The backbone's E and E_out are
        frozen by contract; edit them in place and call :meth:`drop_tables`."""
        w_e, w_c = self.token_proj.weight, self.w_c.weight
        key = (w_e._version, w_c._version, w_e.data_ptr(), w_c.data_ptr(), w_e.device, w_e.dtype)
        cached = getattr(self, "_tables", None)
        if cached is not None and cached[0] == key and cached[1]() is backbone:
            return cached[2], cached[3]
        V, dtype = backbone.vocab_size, w_c.dtype
        te, tc = [], []
        for lo in range(0, V, chunk):
            ids = torch.arange(lo, min(lo + chunk, V), device=w_e.device)
            te.append(self.token_proj(backbone.embed(ids).to(dtype)))
            tc.append(self.w_c(backbone.lm_head_rows(ids).to(dtype)))
        table_e, table_c = torch.cat(te), torch.cat(tc)
        # the backbone by weak reference: a new backbone never matches a dead one's address
        self._tables = (key, weakref.ref(backbone), table_e, table_c)
        return table_e, table_c

    def drop_tables(self) -> None:
        """Forget the folded tables (they are recomputed on the next inference call)."""
        self._tables = None

    def _apply(self, fn: Any, recurse: bool = True) -> Corrector:  # .to(), .cuda(), .float()
        self.drop_tables()
        return super()._apply(fn, recurse)  # type: ignore[no-any-return]

    def _check(self, backbone: Backbone, inputs: CorrectorInputs) -> None:
        c = self.config
        if backbone.hidden_size != c.hidden_size or backbone.vocab_size != c.vocab_size:
            raise ValueError(
                f"backbone: hidden {backbone.hidden_size} / vocab {backbone.vocab_size} do not "
                f"match the corrector's {c.hidden_size} / {c.vocab_size}"
            )
        shape = tuple(inputs.mask_hidden.shape)
        if shape[1:] != (c.M, c.hidden_size):
            raise ValueError(f"mask_hidden: expected [B, {c.M}, {c.hidden_size}], got {shape}")

    def _run(
        self,
        backbone: Backbone,
        inputs: CorrectorInputs,
        temperature: float,
        forced: Tensor | None = None,
        impl: str = "naive",
    ) -> SelectOutput:
        """Project everything that does not depend on earlier selections, in parallel, then run
        the sequential loop (teacher-forced on ``forced [B, M]`` when given)."""
        dtype = self.w_c.weight.dtype
        anchor_ids, cand_ids = inputs.anchor_ids, inputs.cand_ids
        anchor_emb = backbone.embed(anchor_ids).detach().to(dtype)  # [B, H]
        h_c = inputs.anchor_hidden.to(dtype)
        s0 = torch.tanh(self.init_state(torch.cat([h_c, anchor_emb], dim=-1)))
        if torch.is_grad_enabled() or not self.fold_tables:  # gradients reach P_e and W_c

            def token_rows(ids: Tensor) -> Tensor:
                return self.token_proj(backbone.embed(ids).detach().to(dtype))

            cand_c = self.w_c(backbone.lm_head_rows(cand_ids).detach().to(dtype))
        else:  # inference: 64-wide rows of the folded tables
            table_e, table_c = self.tables(backbone)

            def token_rows(ids: Tensor) -> Tensor:
                return table_e[ids]

            cand_c = table_c[cand_ids]
        step = StepInputs(
            s0=s0,
            mask_x=self.hidden_proj(inputs.mask_hidden.to(dtype)),  # [B, M, Dh]
            anchor_e=token_rows(anchor_ids),  # [B, De]
            cand_e=token_rows(cand_ids),  # [B, M, K, De]
            cand_c=cand_c,  # [B, M, K, R]
            cand_logits=inputs.cand_logits.to(dtype),
            cand_ids=cand_ids,
            anchor_ids=anchor_ids,
            u=inputs.u,
            forced_prev=None if forced is None else (forced, token_rows(forced)),
        )
        return select(step, self.step_weights(), temperature, self.config.prefix_feedback, impl)

    def forward(self, backbone: Backbone, inputs: CorrectorInputs, tokens: Tensor) -> Tensor:
        """Teacher-forced refined logits ``[B, M, K]`` along a recorded trajectory.

        ``tokens [B, M]`` is the recorded block x_1..x_M (the base proposal's own choices);
        position j is fed x_{j−1} (x_0 = ``inputs.anchor_ids``) whatever the head would have
        picked. ``inputs.u`` is not read.
        """
        self._check(backbone, inputs)
        return self._run(backbone, inputs, temperature=0.0, forced=tokens).refined

    @torch.no_grad()
    def select(
        self,
        backbone: Backbone,
        inputs: CorrectorInputs,
        temperature: float = 0.0,
        impl: str | None = None,
    ) -> CorrectorSelection:
        """Choose a block among the Top-K candidates of the MASK slots.

        ``inputs.cand_logits [B, M, K]`` are the base logits of the candidates
        ``inputs.cand_ids [B, M, K]``, in descending order (what ``topk`` returns; a
        tensor-parallel vocabulary has exactly these, never the full ``[B, M, V]``).
        ``temperature`` 0 takes the argmax of the refined logits; T > 0 samples from
        π_j = softmax(ℓ̃_j / T) over C_j, the law verification must be given, with the uniforms
        ``inputs.u [B, M]`` (required then). ``impl`` overrides ``self.impl``.
        """
        impl = self.impl if impl is None else impl
        if impl not in IMPLS:
            raise ValueError(f"impl: expected one of {', '.join(IMPLS)}, got {impl!r}")
        self._check(backbone, inputs)
        M, K = self.config.M, self.config.K
        cand_logits, cand_ids = inputs.cand_logits, inputs.cand_ids
        if cand_logits.shape != cand_ids.shape or cand_ids.shape[1:] != (M, K):
            raise ValueError(
                f"cand_ids: expected [B, {M}, {K}] beside cand_logits of the same "
                f"shape, got {tuple(cand_ids.shape)} and {tuple(cand_logits.shape)}"
            )
        cand_logits = cand_logits.to(self.w_c.weight.dtype)  # once: _run reads it as it is
        inputs = replace(inputs, cand_logits=cand_logits)
        out = self._run(backbone, inputs, temperature, impl=impl)
        tokens = cand_ids.gather(-1, out.ranks[..., None]).squeeze(-1)
        return CorrectorSelection(tokens, out.ranks, cand_ids, cand_logits, out.probs, out.refined)

    def num_trainable_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad)

    def save_pretrained(self, path: str | Path) -> None:
        """Write ``model.safetensors`` and ``config.json``; each file is replaced atomically."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        atomic_write(path / WEIGHTS_NAME, lambda tmp: save_file(state, str(tmp)))
        meta = {"format": FORMAT, "version": FORMAT_VERSION, **asdict(self.config)}
        atomic_write(
            path / CONFIG_NAME, lambda tmp: tmp.write_text(json.dumps(meta, indent=2) + "\n")
        )

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        backbone: Backbone | None = None,
        device: torch.device | str | None = None,
    ) -> Corrector:
        """Load a saved head; with ``backbone`` given, its hidden size and vocab must match."""
        path = Path(path)
        config_file = path / CONFIG_NAME
        if not config_file.is_file():
            raise ValueError(f"path: {config_file} not found (not a saved corrector)")
        try:
            meta = json.loads(config_file.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ValueError(f"path: {config_file} is not readable JSON ({err})") from None
        if not isinstance(meta, dict):
            raise ValueError(f"path: {config_file} holds no JSON object")
        if meta.pop("format", None) != FORMAT or meta.pop("version", None) != FORMAT_VERSION:
            raise ValueError(f"path: {config_file} is not a {FORMAT} v{FORMAT_VERSION} config")
        known = {f.name for f in fields(CorrectorConfig)}
        unknown = sorted(set(meta) - known)
        if unknown:
            raise ValueError(f"path: {config_file} has unknown fields {unknown}")
        config = CorrectorConfig(**meta)
        if backbone is not None and (
            backbone.hidden_size != config.hidden_size or backbone.vocab_size != config.vocab_size
        ):
            raise ValueError(
                f"backbone: corrector at {path} was trained for hidden {config.hidden_size} / "
                f"vocab {config.vocab_size}, backbone has {backbone.hidden_size} / "
                f"{backbone.vocab_size}"
            )
        model = cls(config)
        weights = path / WEIGHTS_NAME
        expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
        found = tensor_shapes(weights)
        check_shapes(weights, found, expected)
        extra = sorted(set(found) - set(expected))
        if extra:
            raise ValueError(f"{weights}: tensor {extra[0]!r} is not part of a corrector")
        model.load_state_dict(load_file(str(weights)))
        return model.to(device) if device is not None else model
