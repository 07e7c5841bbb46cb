"""A corrector event store on disk: its format, the writer that fills it during a decode and the
reader the head's training opens (:class:`EventStore`).

A store is a directory::

    _events.json      provenance: checkpoint and tokenizer hashes, sizes (H, V, M, K), decoder
                      options, feature dtype, the number of events; written last
    blocks/           the block log (brisk.mechanism's Parquet format, one row per event):
                      anchor x_0, Top-K candidates C_i, q and the verifier's p over them (p
                      under the block's own recorded prefix, NaN after the first rejection),
                      the base's choices, L, request id, block index, token offset
    features/         what the log lacks, one fixed-size row per event, raw little-endian so it
                      can be memory-mapped: anchor_hidden [n, H], mask_hidden [n, M, H] (float32
                      or float16), cand_logits [n, M, K] (float32: the base logits of C_i,
                      descending), keys [n, 2] (int64 request id and block index: aligns the rows
                      with the log)
    requests.parquet  one row per decoded response: request id, problem, sample, correct

The head's training streams the feature files through ``numpy.memmap``. The Top-K of q is a
prefix of the Top-K' of q for K < K', so one store collected at K' serves heads of every
K ≤ K' (they read the leading K candidates). :mod:`brisk.runtime.train.corrector.events`
collects one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, overload

import numpy as np

from brisk._json import read_json_object
from brisk.runtime.isd.blocklog import BlockLogger, BlockRecord
from brisk.runtime.train.corrector.config import FEATURE_DTYPES

if TYPE_CHECKING:
    from brisk.mechanism.schema import Decoder
    from brisk.runtime.backbone import Backbone
    from brisk.runtime.isd.batched import Draft

__all__ = ["FORMAT", "META", "EventStore", "EventWriter", "feature_shapes"]

META = "_events.json"
FORMAT = "brisk-corrector-events/1"


def feature_shapes(meta: dict[str, Any]) -> dict[str, tuple[tuple[int, ...], str]]:
    """Per-event shape and dtype of every feature file."""
    H, M, K = meta["hidden_size"], meta["M"], meta["K"]
    dtype = meta["feature_dtype"]
    return {
        "anchor_hidden": ((H,), dtype),
        "mask_hidden": ((M, H), dtype),
        "cand_logits": ((M, K), "float32"),
        "keys": ((2,), "int64"),
    }


class EventWriter(BlockLogger):
    """A block logger that also appends the head's inputs of every verified block."""

    collects = True

    def __init__(
        self,
        path: str | Path,
        M: int,
        K: int,
        hidden_size: int,
        feature_dtype: str = "float32",
        decoder: Decoder = "isd",
    ) -> None:
        if feature_dtype not in FEATURE_DTYPES:
            raise ValueError(f"feature_dtype: one of {FEATURE_DTYPES}, got {feature_dtype!r}")
        path = Path(path)
        super().__init__(path / "blocks", M, K, decoder=decoder)
        self.hidden_size, self.feature_dtype = hidden_size, feature_dtype
        self.meta = {"hidden_size": hidden_size, "M": M, "K": K, "feature_dtype": feature_dtype}
        (path / "features").mkdir(parents=True, exist_ok=True)
        self._files: dict[str, BinaryIO] = {
            name: open(path / "features" / f"{name}.bin", "wb")  # noqa: SIM115 (closed in close)
            for name in feature_shapes(self.meta)
        }
        self.events = 0

    def log_round(self, record: BlockRecord, draft: Draft) -> None:
        if draft.mask_hidden is None or draft.anchor_hidden is None or draft.cand_logits is None:
            raise ValueError("draft: proposed without collect=True (no head inputs kept)")
        self.log(record)
        keys = np.stack(
            [record.request_id.cpu().numpy(), record.block_index.cpu().numpy()], 1
        ).astype(np.int64)
        rows = {
            "anchor_hidden": draft.anchor_hidden,
            "mask_hidden": draft.mask_hidden,
            "cand_logits": draft.cand_logits,
        }
        shapes = feature_shapes(self.meta)
        for name, tensor in rows.items():
            array = tensor.detach().float().cpu().numpy().astype(shapes[name][1])
            if not np.isfinite(array).all():  # e.g. a hidden-state outlier beyond float16's range
                raise ValueError(
                    f"{name}: non-finite values as {shapes[name][1]} (largest magnitude "
                    f"{float(tensor.abs().max()):.4g}); collect with feature_dtype='float32'"
                )
            self._files[name].write(array.astype(array.dtype.newbyteorder("<")).tobytes())
        self._files["keys"].write(keys.astype("<i8").tobytes())
        self.events += len(keys)

    def close(self) -> None:
        super().close()
        for f in self._files.values():
            if not f.closed:
                f.close()


class Entry:
    """An integer attribute read from a JSON record the object holds: ``M = Entry("meta")``
    reads ``int(self.meta["M"])``, its key the attribute's own name."""

    def __init__(self, record: str) -> None:
        self.record = record

    def __set_name__(self, owner: type, name: str) -> None:
        self.key = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Entry: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> int: ...
    def __get__(self, obj: object, owner: type | None = None) -> int | Entry:
        return self if obj is None else int(getattr(obj, self.record)[self.key])


@dataclass(frozen=True)
class EventStore:
    """An event store opened for training: log columns in memory, features memory-mapped.

    Arrays, n events: ``anchor`` [n], ``cand_ids`` [n, M, K] int64, ``p`` / ``q`` [n, M, K]
    (p NaN where not reached), ``base_choice`` [n, M], ``accept_len`` [n], ``request_id`` [n],
    ``correct`` [n] (the event's response was graded correct); memory-mapped ``anchor_hidden``
    [n, H], ``mask_hidden`` [n, M, H], ``cand_logits`` [n, M, K].
    """

    path: Path
    meta: dict[str, Any]
    anchor: np.ndarray
    cand_ids: np.ndarray
    p: np.ndarray
    q: np.ndarray
    base_choice: np.ndarray
    accept_len: np.ndarray
    request_id: np.ndarray
    correct: np.ndarray
    anchor_hidden: np.ndarray
    mask_hidden: np.ndarray
    cand_logits: np.ndarray

    M = Entry("meta")
    K = Entry("meta")
    hidden_size = Entry("meta")
    vocab_size = Entry("meta")

    def __len__(self) -> int:
        return len(self.anchor)

    @classmethod
    def open(cls, path: str | Path) -> EventStore:
        """Open and check a store; every error names the file and what is wrong."""
        import pyarrow.parquet as pq

        from brisk.mechanism import read_blocks

        path = Path(path)
        meta_file = path / META
        if not meta_file.is_file():
            raise ValueError(
                f"{path}: not a corrector event store (no {META}; was collection interrupted?)"
            )
        meta = read_json_object(meta_file)
        if meta.get("format") != FORMAT:
            raise ValueError(f"{meta_file}: not a {FORMAT} file")
        n = int(meta["events"])
        if n == 0:
            raise ValueError(f"{meta_file}: the store holds no events")
        features: dict[str, np.ndarray] = {}
        for name, (shape, dtype) in feature_shapes(meta).items():
            file = path / "features" / f"{name}.bin"
            row = int(np.prod(shape)) * np.dtype(dtype).itemsize
            size = file.stat().st_size if file.is_file() else -1
            if size != n * row:
                found = "missing" if size < 0 else f"{size} bytes"
                raise ValueError(
                    f"{file}: {found}, expected {n * row} ({n} events × {row} bytes; truncated "
                    "or from another store)"
                )
            features[name] = np.memmap(
                file, dtype=np.dtype(dtype).newbyteorder("<"), mode="r", shape=(n, *shape)
            )
        columns = [
            "request_id",
            "block_index",
            "anchor",
            "cand_ids",
            "q",
            "p",
            "base_choice",
            "accept_len",
        ]
        batches = list(read_blocks(path / "blocks", columns=columns, prefetch=False))
        log = {c: np.concatenate([b[c] for b in batches]) for c in columns}
        if len(log["anchor"]) != n:
            raise ValueError(f"{path / 'blocks'}: {len(log['anchor'])} rows, {meta_file} says {n}")
        if log["cand_ids"].shape[1:] != (meta["M"], meta["K"]):
            raise ValueError(
                f"{path / 'blocks'}: M, K = {log['cand_ids'].shape[1:]}, "
                f"{meta_file} says {meta['M']}, {meta['K']}"
            )
        keys = np.stack([log["request_id"], log["block_index"]], 1)
        if not np.array_equal(keys, np.asarray(features["keys"])):
            bad = int(np.argmax((keys != np.asarray(features["keys"])).any(1)))
            raise ValueError(
                f"{path / 'features' / 'keys.bin'}: row {bad} is not the log's row {bad} "
                "(features and block log out of step)"
            )
        requests = pq.read_table(path / "requests.parquet").to_pydict()
        good = {r for r, ok in zip(requests["request_id"], requests["correct"], strict=True) if ok}
        return cls(
            path=path,
            meta=meta,
            anchor=log["anchor"].astype(np.int64),
            cand_ids=log["cand_ids"].astype(np.int64),
            p=log["p"].astype(np.float32),
            q=log["q"].astype(np.float32),
            base_choice=log["base_choice"].astype(np.int64),
            accept_len=log["accept_len"].astype(np.int64),
            request_id=log["request_id"].astype(np.int64),
            correct=np.isin(log["request_id"], list(good)),
            anchor_hidden=features["anchor_hidden"],
            mask_hidden=features["mask_hidden"],
            cand_logits=features["cand_logits"],
        )

    def check_backbone(self, backbone: Backbone) -> None:
        """The store must come from a backbone of this hidden size and vocabulary."""
        if (backbone.hidden_size, backbone.vocab_size) != (self.hidden_size, self.vocab_size):
            raise ValueError(
                f"{self.path / META}: events of a backbone with hidden {self.hidden_size} / vocab "
                f"{self.vocab_size}, this one has {backbone.hidden_size} / {backbone.vocab_size}"
            )
