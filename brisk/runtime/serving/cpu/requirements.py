"""Check that the CPU serving environment (``make serving-venv``) is complete.

SGLang 0.5.23 declares CUDA builds among its requirements (``torch==2.14.1``, ``sglang-kernel``,
flashinfer, …), so the CPU install takes it with ``--no-deps`` and ``requirements-serving.txt``
lists what its CPU path imports. ``pip check`` then cannot pass; this check is ``pip check`` with
the requirements left out on purpose named, each with its reason. Every other requirement of
every installed distribution (brisk's own included) must be met.

``python -m brisk.runtime.serving.cpu.requirements`` prints nothing and exits 0 when the
environment is complete; otherwise it prints one line per unmet requirement and exits 1.
"""

from __future__ import annotations

import sys
from importlib import metadata

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

__all__ = ["LEFT_OUT", "unmet"]

_CUDA = "CUDA-only"
_FEATURE = "an optional SGLang feature brisk's CPU serving does not use"

# sglang's requirements this CPU install leaves out, by canonical name: why.
LEFT_OUT: dict[str, str] = {
    "torch": "sglang pins the CUDA build torch==2.14.1; constraints.txt's CPU torch serves",
    "sglang-kernel": "CUDA-only; brisk.runtime.serving.cpu's sgl_kernel stand-in replaces it",
    "torchvision": "wheels need CUDA torch; brisk.runtime.serving.cpu's stand-in replaces it",
    "torchaudio": "audio models; wheels built against CUDA torch",
    "torchcodec": "audio/video decoding; wheels built against CUDA torch",
    "timm": "vision towers; requires torchvision",
    "cuda-python": _CUDA,
    "deepseek-recipe": "DeepSeek model recipes; " + _CUDA,
    "flash-attn-4": _CUDA,
    "flashinfer-python": _CUDA,
    "humming-kernels": _CUDA,
    "kernels": "Hugging Face kernel hub; " + _CUDA,
    "nvidia-cutlass-dsl": _CUDA,
    "nvidia-mathdx": _CUDA,
    "nvidia-ml-py": "NVML, GPU monitoring",
    "nvshmem4py-cu13": _CUDA,
    "quack-kernels": _CUDA,
    "sgl-deep-ep": _CUDA,
    "sgl-deep-gemm": _CUDA,
    "sgl-flash-mla": _CUDA,
    "tilelang": _CUDA,
    "torch-memory-saver": _CUDA,
    "ninja": "JIT builds of CUDA kernels",
    "numba": "JIT kernels of multimodal processors",
    "anthropic": "the Anthropic-compatible API: " + _FEATURE,
    "openai-harmony": "gpt-oss and the Responses API: " + _FEATURE,
    "interegular": "the outlines grammar backend (xgrammar is installed): " + _FEATURE,
    "outlines": "the outlines grammar backend (xgrammar is installed): " + _FEATURE,
    "llguidance": "the llguidance grammar backend (xgrammar is installed): " + _FEATURE,
    "mistral-common": "Mistral tokenizers: " + _FEATURE,
    "tiktoken": "tiktoken tokenizers: " + _FEATURE,
    "tml-renderers": "chat renderers: " + _FEATURE,
    "modelscope": "ModelScope downloads: " + _FEATURE,
    "blobfile": "remote weight files: " + _FEATURE,
    "easydict": "a model's config helper: " + _FEATURE,
    "build": "building packages at run time: " + _FEATURE,
    "prometheus-client": "--enable-metrics: " + _FEATURE,
    "py-spy": "stack dumps of a hung server: " + _FEATURE,
    "smg-grpc-servicer": "the gRPC server mode: " + _FEATURE,
    "watchfiles": "reload on file change: " + _FEATURE,
    "zstandard": "compressed weight transfer: " + _FEATURE,
}


def unmet() -> list[str]:
    """One line per requirement of an installed distribution that is not met (missing, or the
    wrong version), except sglang's in :data:`LEFT_OUT`; extras are not requirements here."""
    installed = {canonicalize_name(d.metadata["Name"]): d.version for d in metadata.distributions()}
    problems = []
    for dist in metadata.distributions():
        name = canonicalize_name(dist.metadata["Name"])
        for line in dist.requires or []:
            try:
                req = Requirement(line)
            except InvalidRequirement:
                continue
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            wanted = canonicalize_name(req.name)
            if name == "sglang" and wanted in LEFT_OUT:
                continue
            have = installed.get(wanted)
            if have is None:
                problems.append(f"{name} requires {req}, which is not installed")
            elif not req.specifier.contains(have, prereleases=True):
                problems.append(f"{name} requires {req}, but {have} is installed")
    return sorted(set(problems))


def main() -> int:
    problems = unmet()
    for line in problems:
        print(line, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
