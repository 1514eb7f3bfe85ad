"""LlamaIndex: :class:`CanopyPostprocessor`, CANOPY as a node postprocessor.

    from canopy_ray.integrations.llamaindex import CanopyPostprocessor
    nodes = index.as_retriever(similarity_top_k=5).retrieve(question)
    nodes = CanopyPostprocessor().postprocess_nodes(nodes, query_str=question)
    # or: index.as_query_engine(node_postprocessors=[CanopyPostprocessor(url="http://127.0.0.1:8000")])

Needs ``llama-index-core`` (``pip install "canopy-ray[llamaindex]"``). See
:mod:`canopy_ray.integrations` for what happens to each node.
"""

from __future__ import annotations

from typing import Any, List, Optional

from llama_index.core.bridge.pydantic import Field
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle, TextNode

from canopy_ray.integrations import REPORT_KEY, compress_texts, left_out


class CanopyPostprocessor(BaseNodePostprocessor):
    """Replaces each retrieved text node's text by CANOPY's kept evidence for the query (a node
    it leaves out is dropped);
    node ids, scores and metadata stay, ``metadata["canopy"]`` gets the token report (kept out
    of the LLM's and the embedder's view of the metadata)."""

    url: Optional[str] = Field(None, description="a served engine (canopy serve); None: this process")
    config: Any = Field(None, description="in process: a YAML path or CanopyConfig (default: the CPU defaults)")
    branching: Optional[int] = Field(None, description="B, children per tree node (default: the config's)")
    policy: Optional[str] = Field(None, description="refinement.policy, e.g. 'canopy margin=0.05' (default: the config's)")
    title_key: str = Field("title", description="the metadata key holding a node's title")

    @classmethod
    def class_name(cls) -> str:
        return "CanopyPostprocessor"

    def _postprocess_nodes(self, nodes: List[NodeWithScore],
                           query_bundle: Optional[QueryBundle] = None) -> List[NodeWithScore]:
        if query_bundle is None:
            raise ValueError("CanopyPostprocessor needs the query: pass query_bundle or query_str")
        texts = [(n.node.node_id, str(n.node.metadata.get(self.title_key) or ""),
                  n.node.get_content(metadata_mode=MetadataMode.NONE) if isinstance(n.node, TextNode) else "")
                 for n in nodes]
        done = compress_texts(query_bundle.query_str, texts, url=self.url, config=self.config,
                              branching=self.branching, policy=self.policy)
        out = []
        for n, result in zip(nodes, done):
            if result is None:
                out.append(n)
                continue
            if left_out(result):
                continue
            node = n.node.model_copy(deep=True)
            node.set_content(result[0])
            node.metadata[REPORT_KEY] = result[1]
            for keys in (node.excluded_llm_metadata_keys, node.excluded_embed_metadata_keys):
                if REPORT_KEY not in keys:
                    keys.append(REPORT_KEY)
            out.append(NodeWithScore(node=node, score=n.score))
        return out
