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

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, populate_by_name=True,
                              serialize_by_alias=True)

    name: SafeName  # reaches terminals and profile file names
    num_layers: int = Field(strict=True, ge=1, le=10_000)  # upper bounds keep every count a finite float
    hidden_size: int = Field(strict=True, ge=1, le=1_000_000)
    ffn_hidden_size: int = Field(strict=True, ge=1, le=10_000_000)
    num_attention_heads: int = Field(strict=True, ge=1, le=1_000_000)
    num_kv_heads: int | None = Field(strict=True, default=None, ge=1)
    vocab_size: int = Field(strict=True, ge=1, le=100_000_000)
    max_sequence_length: int = Field(strict=True, default=2048, ge=1, le=100_000_000)
    num_experts: int = Field(strict=True, default=1, ge=1, le=100_000)
    experts_top_k: int = Field(strict=True, default=1, ge=1)
    moe_layer_frequency: int = Field(strict=True, default=1, ge=1, le=10_000)
    tied_embeddings: bool = Field(default=False, strict=True)
    # optional additions (not in formats v1)
    aliases: tuple[str, ...] = ()
    mlp: Literal["gelu", "relu", "swiglu", "geglu"] = "gelu"
    """FFN kind: ``gelu``/``relu`` have two matrices, the gated ``swiglu``/``geglu`` three."""
    bias: bool = Field(default=True, strict=True)
    """Linear-layer biases and LayerNorm (``false``: no biases, RMSNorm)."""
    position_embedding: Literal["learned", "rope", "alibi", "none"] = "learned"
    """Only ``learned`` holds parameters (a ``max_sequence_length x hidden_size`` table)."""
    # formats v2 section 6 (stored under other names where a property of the same name exists)
    head_dim_field: int | None = Field(strict=True, default=None, ge=1, le=1_000_000, alias="head_dim")
    """Per-head width of ``mha`` attention; default ``hidden_size / num_attention_heads``."""
    attention: Literal["mha", "mla"] = "mha"
    """``mha`` (grouped-query when ``num_kv_heads`` < heads) or multi-head latent attention."""
    q_lora_rank: int | None = Field(strict=True, default=None, ge=1, le=1_000_000)
    """MLA: rank of the compressed queries; null = queries projected directly from the hidden state."""
    kv_lora_rank: int | None = Field(strict=True, default=None, ge=1, le=1_000_000)
    """MLA: rank of the compressed keys and values (required with ``mla``)."""
    qk_nope_head_dim: int | None = Field(strict=True, default=None, ge=1, le=1_000_000)
    """MLA: per-head query/key width without rotary embedding (required with ``mla``)."""
    qk_rope_head_dim: int | None = Field(strict=True, default=None, ge=0, le=1_000_000)
    """MLA: per-head query/key width with rotary embedding; the rotary key is shared by all heads."""
    v_head_dim: int | None = Field(strict=True, default=None, ge=1, le=1_000_000)
    """MLA: per-head value width (required with ``mla``)."""
    capacity_factor: float | None = Field(default=None, gt=0, le=1_000)
    """MoE: tokens per expert capped at ``capacity_factor * tokens * top_k / num_experts``; null = dropless."""
    moe_ffn_hidden_size: int | None = Field(strict=True, default=None, ge=1, le=10_000_000)
    num_shared_experts: int = Field(strict=True, default=0, ge=0, le=100_000)
    shared_expert_ffn_hidden_size: int | None = Field(strict=True, default=None, ge=1, le=1_000_000_000)
    first_dense_layers: int = Field(strict=True, default=0, ge=0, le=10_000)
    source: str = ""

    @model_validator(mode="after")
    def _check(self) -> "ModelSpec":
        kv = self.kv_heads
        if self.attention == "mha" and self.head_dim_field is None and self.hidden_size % self.num_attention_heads:
            raise ValueError("hidden_size must be divisible by num_attention_heads (or give head_dim)")
        if self.num_attention_heads % kv:
            raise ValueError("num_attention_heads must be divisible by num_kv_heads")
        if self.experts_top_k > self.num_experts:
            raise ValueError("experts_top_k must not exceed num_experts")
        mla_keys = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
        if self.attention == "mla":
            for key in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
                if getattr(self, key) is None:
                    raise ValueError(f"attention mla needs {key}")
            if self.head_dim_field is not None:
                raise ValueError("head_dim is for mha attention; mla uses qk_nope_head_dim, qk_rope_head_dim "
                                 "and v_head_dim")
            if kv != self.num_attention_heads:
                raise ValueError("attention mla has no grouped keys/values: num_kv_heads must equal "
                                 "num_attention_heads")
        else:
            for key in mla_keys:
                if getattr(self, key) is not None:
                    raise ValueError(f"{key} is only for attention mla")
        if self.capacity_factor is not None and not self.is_moe:
            raise ValueError("capacity_factor is only for MoE models (num_experts > 1)")
        if self.first_dense_layers > self.num_layers:
            raise ValueError(f"first_dense_layers {self.first_dense_layers} exceeds num_layers {self.num_layers}")
        return self

    # ---- shape helpers -------------------------------------------------------------------
    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_attention_heads

    @property
    def head_dim(self) -> int:
        """Per-head width of query/key (and value, for ``mha``)."""
        if self.attention == "mla":
            return self.qk_nope_head_dim + self.qk_rope_head_dim  # type: ignore[operator]
        return self.head_dim_field or self.hidden_size // self.num_attention_heads

    @property
    def v_dim(self) -> int:
        """Per-head value width (``head_dim`` for ``mha``)."""
        return self.v_head_dim if self.attention == "mla" else self.head_dim  # type: ignore[return-value]

    @property
    def mlp_matrices(self) -> int:
        """FFN matrices: 3 for the gated kinds (swiglu, geglu), else 2."""
        return 3 if self.mlp in ("swiglu", "geglu") else 2

    @cached_property
    def attention_gemms(self) -> tuple[tuple[int, int, bool], ...]:
        """The attention projections as ``(in, out, split_by_tp)``, in execution order.

        ``mha``: fused q/k/v, then the output projection. ``mla`` (DeepSeek-V2, arXiv 2405.04434 section
        2.1): the query down/up projections (or one query projection without ``q_lora_rank``), the
        key/value down projection (plus the shared rotary key), the key/value up projection and the output
        projection; the down projections are replicated across tp, as Megatron-Core's MLA runs them."""
        h, a = self.hidden_size, self.num_attention_heads
        if self.attention == "mha":
            qd, kvd = a * self.head_dim, self.kv_heads * self.head_dim
            return ((h, qd + 2 * kvd, True), (qd, h, True))
        qk, rope, kvr = self.head_dim, self.qk_rope_head_dim, self.kv_lora_rank
        out: list[tuple[int, int, bool]] = []
        if self.q_lora_rank:
            out += [(h, self.q_lora_rank, False), (self.q_lora_rank, a * qk, True)]
        else:
            out.append((h, a * qk, True))
        out += [(h, kvr + rope, False), (kvr, a * (self.qk_nope_head_dim + self.v_dim), True),  # type: ignore
                (a * self.v_dim, h, True)]
        return tuple(out)

    @cached_property
    def attention_activation_widths(self) -> tuple[int, int]:
        """Per-token activation elements attention keeps for backward: (split over tp, replicated).

        ``mha``: q, k, v and the attention output. ``mla``: also the compressed query/key-value latents
        (replicated, with their norms' outputs)."""
        a = self.num_attention_heads
        if self.attention == "mha":
            qd, kvd = a * self.head_dim, self.kv_heads * self.head_dim
            return (qd + 2 * kvd) + qd, 0
        split = 2 * a * self.head_dim + 2 * a * self.v_dim
        latent = (self.q_lora_rank or 0) + self.kv_lora_rank + self.qk_rope_head_dim  # type: ignore[operator]
        return split, 2 * latent

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
    def tp_error(self, tp: int, whole_kv_groups: bool = False, etp: int | None = None) -> str | None:
        """Why tensor parallelism of degree ``tp`` cannot split this model's blocks, or None when it can.

        ``tp`` must divide the attention heads, the FFN width and (MoE) the experts' FFN width. A key/value
        head may serve query heads on several ranks (arachne's runtime gives each rank the KV heads its
        query heads read); ``whole_kv_groups`` also asks ``tp`` to divide the KV heads, as Megatron-LM does.
        With ``etp`` (formats v2) the routed experts are split ``etp`` ways instead of ``tp``."""
        if tp < 1:
            return f"tp {tp} must be at least 1"
        if self.num_attention_heads % tp:
            return f"tp {tp} does not divide num_attention_heads {self.num_attention_heads}"
        if self.ffn_hidden_size % tp:
            return f"tp {tp} does not divide ffn_hidden_size {self.ffn_hidden_size}"
        if self.is_moe and etp is None and self.expert_ffn % tp:
            return f"tp {tp} does not divide the experts' ffn width {self.expert_ffn}"
        if whole_kv_groups and self.kv_heads % tp:
            return f"tp {tp} does not divide num_kv_heads {self.kv_heads} (whole query groups per rank)"
        if etp is not None and self.is_moe:
            return self.etp_error(etp)
        return None

    def etp_error(self, etp: int) -> str | None:
        """Why the routed experts cannot be split ``etp`` ways (expert tensor parallelism), or None."""
        if etp < 1:
            return f"etp {etp} must be at least 1"
        if etp > 1 and not self.is_moe:
            return f"etp {etp} on a dense model"
        if self.is_moe and self.expert_ffn % etp:
            return f"etp {etp} does not divide the experts' ffn width {self.expert_ffn}"
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
        return self.mlp_matrices

    @cached_property
    def attention_params(self) -> int:
        """Projection weights (and biases), plus MLA's latent norms."""
        p = sum(i * o for i, o, _ in self.attention_gemms)
        if self.bias:
            p += sum(o for _, o, _ in self.attention_gemms)
        if self.attention == "mla":  # norms of the compressed query and key/value latents
            p += ((self.q_lora_rank or 0) + self.kv_lora_rank) * (2 if self.bias else 1)  # type: ignore[operator]
        return p

    @cached_property
    def attention_replicated_params(self) -> int:
        """The part of :attr:`attention_params` every tp rank holds whole (MLA's down projections, norms)."""
        if self.attention == "mha":
            return 0
        return self.attention_params - sum(i * o + (o if self.bias else 0) for i, o, s in self.attention_gemms if s)

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
        """Matmul FLOPs of attention projections plus scores (q.k and scores.v, not halved for the causal
        mask) for one sequence, forward."""
        proj = 2 * seq * sum(i * o for i, o, _ in self.attention_gemms)
        scores = 2 * seq * seq * self.num_attention_heads * (self.head_dim + self.v_dim)
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
    return model.model_dump(exclude_defaults=True, exclude={"aliases", "source"}, by_alias=True)


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
