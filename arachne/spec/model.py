"""Transformer shapes (dense and MoE): parameters, FLOPs and activation sizes per block."""

from __future__ import annotations

from functools import cached_property, lru_cache
from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from arachne.errors import InputError, from_validation_error, load_document, load_yaml
from arachne.spec.gpus import normalize_name
from arachne.spec.names import SafeName


class ModelSpec(BaseModel):
    """A transformer as in formats v1 section 2, plus optional shape details arachne uses."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: SafeName  # reaches terminals and profile file names
    num_layers: int = Field(ge=1, le=10_000)  # upper bounds keep every count a finite float
    hidden_size: int = Field(ge=1, le=1_000_000)
    ffn_hidden_size: int = Field(ge=1, le=10_000_000)
    num_attention_heads: int = Field(ge=1, le=1_000_000)
    num_kv_heads: int | None = Field(default=None, ge=1)
    vocab_size: int = Field(ge=1, le=100_000_000)
    max_sequence_length: int = Field(default=2048, ge=1, le=100_000_000)
    num_experts: int = Field(default=1, ge=1, le=100_000)
    experts_top_k: int = Field(default=1, ge=1)
    moe_layer_frequency: int = Field(default=1, ge=1, le=10_000)
    tied_embeddings: bool = False
    # optional additions (not in formats v1)
    aliases: tuple[str, ...] = ()
    mlp: Literal["gelu", "swiglu"] = "gelu"
    bias: bool = True
    position_embedding: Literal["learned", "rope"] = "learned"
    moe_ffn_hidden_size: int | None = Field(default=None, ge=1, le=10_000_000)
    num_shared_experts: int = Field(default=0, ge=0, le=100_000)
    shared_expert_ffn_hidden_size: int | None = Field(default=None, ge=1, le=1_000_000_000)
    first_dense_layers: int = Field(default=0, ge=0, le=10_000)
    source: str = ""

    @model_validator(mode="after")
    def _check(self) -> "ModelSpec":
        kv = self.kv_heads
        if self.hidden_size % self.num_attention_heads:
            raise ValueError("hidden_size must be divisible by num_attention_heads")
        if self.num_attention_heads % kv:
            raise ValueError("num_attention_heads must be divisible by num_kv_heads")
        if self.experts_top_k > self.num_experts:
            raise ValueError("experts_top_k must not exceed num_experts")
        return self

    # ---- shape helpers -------------------------------------------------------------------
    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_attention_heads

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @property
    def expert_ffn(self) -> int:
        return self.moe_ffn_hidden_size or self.ffn_hidden_size

    def is_moe_layer(self, index: int) -> bool:
        """Whether block ``index`` (0-based) holds experts."""
        if not self.is_moe or index < self.first_dense_layers:
            return False
        return (index - self.first_dense_layers) % self.moe_layer_frequency == self.moe_layer_frequency - 1

    @cached_property
    def moe_layers(self) -> tuple[bool, ...]:
        return tuple(self.is_moe_layer(i) for i in range(self.num_layers))

    # ---- parallelism rules: the one home (plan validation, planners, export and the CLI ask here) ----
    def tp_error(self, tp: int, whole_kv_groups: bool = False) -> str | None:
        """Why tensor parallelism of degree ``tp`` cannot split this model's blocks, or None when it can.

        ``tp`` must divide the attention heads, the FFN width and (MoE) the experts' FFN width. A key/value
        head may serve query heads on several ranks (arachne's runtime gives each rank the KV heads its
        query heads read); ``whole_kv_groups`` also asks ``tp`` to divide the KV heads, as Megatron-LM does."""
        if tp < 1:
            return f"tp {tp} must be at least 1"
        if self.num_attention_heads % tp:
            return f"tp {tp} does not divide num_attention_heads {self.num_attention_heads}"
        if self.ffn_hidden_size % tp:
            return f"tp {tp} does not divide ffn_hidden_size {self.ffn_hidden_size}"
        if self.is_moe and self.expert_ffn % tp:
            return f"tp {tp} does not divide the experts' ffn width {self.expert_ffn}"
        if whole_kv_groups and self.kv_heads % tp:
            return f"tp {tp} does not divide num_kv_heads {self.kv_heads} (whole query groups per rank)"
        return None

    def tp_allowed(self, tp: int, whole_kv_groups: bool = False) -> bool:
        """Whether :meth:`tp_error` finds nothing."""
        return self.tp_error(tp, whole_kv_groups) is None

    def ep_error(self, ep: int) -> str | None:
        """Why expert parallelism of degree ``ep`` cannot split this model's experts, or None when it can:
        ``ep`` 1 always; otherwise only on an MoE model, dividing ``num_experts``. (A stage's ``ep`` must also
        divide its data-parallel size: a plan rule, checked with the plan.)"""
        if ep < 1:
            return f"ep {ep} must be at least 1"
        if ep == 1:
            return None
        if not self.is_moe:
            return f"ep {ep} on a dense model"
        if self.num_experts % ep:
            return f"ep {ep} does not divide num_experts {self.num_experts}"
        return None

    def ep_allowed(self, ep: int) -> bool:
        """Whether :meth:`ep_error` finds nothing."""
        return self.ep_error(ep) is None

    def padded_vocab(self, tp: int = 1) -> int:
        """Vocabulary padded to a multiple of 128 * tp, as Megatron does."""
        mult = 128 * tp
        return -(-self.vocab_size // mult) * mult

    # ---- parameters -------------------------------------------------------------------------
    @property
    def _mlp_mats(self) -> int:
        return 3 if self.mlp == "swiglu" else 2

    @cached_property
    def attention_params(self) -> int:
        h, kvd = self.hidden_size, self.kv_heads * self.head_dim
        p = h * (h + 2 * kvd) + h * h
        if self.bias:
            p += h + 2 * kvd + h
        return p

    @cached_property
    def norm_params(self) -> int:
        """Two norms per block (weight, plus bias for LayerNorm-style models)."""
        return 2 * self.hidden_size * (2 if self.bias else 1)

    def mlp_params(self, ffn: int) -> int:
        p = self._mlp_mats * self.hidden_size * ffn
        if self.bias:
            p += ffn * (self._mlp_mats - 1) + self.hidden_size
        return p

    @cached_property
    def dense_block_params(self) -> int:
        return self.attention_params + self.norm_params + self.mlp_params(self.ffn_hidden_size)

    @cached_property
    def expert_params(self) -> int:
        """Parameters of one routed expert."""
        return self.mlp_params(self.expert_ffn)

    @cached_property
    def shared_expert_params(self) -> int:
        if not self.num_shared_experts:
            return 0
        return self.mlp_params(self.shared_expert_ffn_hidden_size or self.expert_ffn * self.num_shared_experts)

    @cached_property
    def moe_block_params(self) -> int:
        """All parameters of an MoE block (all experts)."""
        router = self.hidden_size * self.num_experts
        return (self.attention_params + self.norm_params + router + self.shared_expert_params
                + self.num_experts * self.expert_params)

    def block_params(self, index: int) -> int:
        return self.moe_block_params if self.moe_layers[index] else self.dense_block_params

    def block_expert_params(self, index: int) -> int:
        """Routed-expert parameters of block ``index`` (sharded by ep); 0 for dense blocks."""
        return self.num_experts * self.expert_params if self.moe_layers[index] else 0

    def embedding_params(self, tp: int = 1) -> int:
        p = self.padded_vocab(tp) * self.hidden_size
        if self.position_embedding == "learned":
            p += self.max_sequence_length * self.hidden_size
        return p

    def head_params(self, tp: int = 1) -> int:
        """Final norm plus output projection (0 projection when tied to the embedding)."""
        norm = self.hidden_size * (2 if self.bias else 1)
        return norm + (0 if self.tied_embeddings else self.padded_vocab(tp) * self.hidden_size)

    @cached_property
    def num_params(self) -> int:
        blocks = sum(self.block_params(i) for i in range(self.num_layers))
        return blocks + self.embedding_params() + self.head_params()

    @cached_property
    def active_params(self) -> int:
        """Parameters touched per token (MoE: top-k experts only)."""
        total = self.embedding_params() + self.head_params()
        for i in range(self.num_layers):
            if self.moe_layers[i]:
                total += (self.moe_block_params - self.num_experts * self.expert_params
                          + self.experts_top_k * self.expert_params)
            else:
                total += self.dense_block_params
        return total

    # ---- FLOPs (forward, per sequence of length s) ------------------------------------------
    def attention_flops(self, seq: int) -> float:
        """Matmul FLOPs of attention projections plus scores for one sequence, forward."""
        h, kvd = self.hidden_size, self.kv_heads * self.head_dim
        proj = 2 * seq * (h * (h + 2 * kvd) + h * h)
        scores = 4 * seq * seq * h
        return proj + scores

    def block_flops(self, index: int, seq: int) -> float:
        """Forward FLOPs of block ``index`` for one sequence (MoE: top-k experts and router)."""
        f = self.attention_flops(seq)
        h = self.hidden_size
        if self.moe_layers[index]:
            f += 2 * seq * h * self.num_experts
            f += 2 * seq * self.experts_top_k * self._mlp_mats * h * self.expert_ffn
            if self.num_shared_experts:
                width = self.shared_expert_ffn_hidden_size or self.expert_ffn * self.num_shared_experts
                f += 2 * seq * self._mlp_mats * h * width
        else:
            f += 2 * seq * self._mlp_mats * h * self.ffn_hidden_size
        return f

    def head_flops(self, seq: int) -> float:
        return 2 * seq * self.hidden_size * self.padded_vocab()

    @cached_property
    def _flops_per_token_cache(self) -> dict[int, float]:
        return {}

    def model_flops_per_sequence(self, seq: int) -> float:
        """Training FLOPs per sequence (forward + backward = 3x forward), the MFU numerator."""
        cache = self._flops_per_token_cache
        if seq not in cache:
            fwd = sum(self.block_flops(i, seq) for i in range(self.num_layers)) + self.head_flops(seq)
            cache[seq] = 3 * fwd
        return cache[seq]

    @cached_property
    def key(self) -> str:
        """Value key for caches (two identical shapes share cache entries)."""
        return self.model_dump_json()

    def matches(self, name: str) -> bool:
        key = normalize_name(name)
        return key == normalize_name(self.name) or any(key == normalize_name(a) for a in self.aliases)


def model_ref(model: ModelSpec) -> str | dict:
    """How a plan names ``model``: its catalog name, or the whole document when it is not a catalog model."""
    if model_catalog().get(model.name) == model:
        return model.name
    return model.model_dump(exclude_defaults=True, exclude={"aliases", "source"})


class ModelCatalog:
    """Lookup of catalog models by name or alias (case and punctuation insensitive)."""

    def __init__(self, models: list[ModelSpec]):
        self.models = list(models)
        self._index = {}
        for m in self.models:
            for key in (m.name, *m.aliases):
                k = normalize_name(key)
                if k in self._index and self._index[k].name != m.name:
                    raise ValueError(f"model name {key!r} is ambiguous in the catalog")
                self._index[k] = m

    def get(self, name: str) -> ModelSpec | None:
        return self._index.get(normalize_name(name))

    def names(self) -> list[str]:
        return [m.name for m in self.models]


@lru_cache(maxsize=1)
def model_catalog() -> ModelCatalog:
    """The shipped model catalog (``arachne/data/models.yaml``)."""
    text = resources.files("arachne.data").joinpath("models.yaml").read_text()
    return ModelCatalog([ModelSpec(**m) for m in load_yaml(text)["models"]])


def model_from_dict(data: dict, source: str = "", prefix: str = "") -> ModelSpec:
    """Validate an inline model document."""
    try:
        return ModelSpec(**data)
    except ValidationError as err:
        raise from_validation_error(source, err, prefix) from None
    except TypeError as err:
        raise InputError(source, prefix, str(err)) from None


def load_model(ref: str | dict | ModelSpec, source: str = "", field: str = "model",
               allow_files: bool = True) -> ModelSpec:
    """A model from a catalog name, an inline document, or (``allow_files``) the path of a YAML/JSON file."""
    if isinstance(ref, ModelSpec):
        return ref
    if isinstance(ref, dict):
        return model_from_dict(ref, source, field)
    if not isinstance(ref, str) or not ref:
        raise InputError(source, field, "expected a catalog model name or a model document")
    found = model_catalog().get(ref)
    if found is not None:
        return found
    path = Path(ref)
    if allow_files and (path.suffix.lower() in (".yaml", ".yml", ".json") or path.is_file()):
        return model_from_dict(load_document(path), str(path))
    raise InputError(source, field, f"unknown model {ref!r} (see `arachne models`)")
