"""CanopyPostprocessor in a real LlamaIndex pipeline: a VectorStoreIndex over the packaged
MiniLM, its retriever, then CANOPY; the nodes keep ids, scores and metadata."""

import pytest

pytest.importorskip("llama_index.core", reason="the llamaindex extra is not installed")

from llama_index.core import Document, VectorStoreIndex  # noqa: E402
from llama_index.core.base.embeddings.base import BaseEmbedding  # noqa: E402
from llama_index.core.llms.mock import MockLLM  # noqa: E402
from llama_index.core.schema import MetadataMode  # noqa: E402

import canopy_ray  # noqa: E402
from canopy_ray.integrations import text_item  # noqa: E402
from canopy_ray.integrations.llamaindex import CanopyPostprocessor  # noqa: E402

from tests.integrations.corpus import DOCS, F0, QUERY  # noqa: E402

pytestmark = pytest.mark.integration


class MiniLM(BaseEmbedding):
    """LlamaIndex embeddings from canopy-ray's packaged MiniLM (f0)."""

    encoder: object = None

    def _get_text_embeddings(self, texts):
        return self.encoder.encode_queries(list(texts)).tolist()

    def _get_text_embedding(self, text):
        return self._get_text_embeddings([text])[0]

    def _get_query_embedding(self, query):
        return self._get_text_embedding(query)

    async def _aget_query_embedding(self, query):
        return self._get_query_embedding(query)


@pytest.fixture(scope="module")
def index(minilm):
    docs = [Document(text=text, id_=i, metadata={"title": title, "source": "wiki"}) for i, title, text in DOCS]
    return VectorStoreIndex.from_documents(docs, embed_model=MiniLM(encoder=minilm))


def test_postprocessor_after_the_retriever(index):
    retrieved = index.as_retriever(similarity_top_k=2).retrieve(QUERY)
    originals = [n.node.get_content() for n in retrieved]
    out = CanopyPostprocessor(config=F0).postprocess_nodes(retrieved, query_str=QUERY)
    assert out[0].node.ref_doc_id == "eiffel"
    assert [n.node.get_content() for n in retrieved] == originals  # the retrieved nodes are not touched

    expected = canopy_ray.compress(QUERY, [text_item(n.node.node_id, n.node.metadata["title"], text)
                                           for n, text in zip(retrieved, originals)], config=F0)
    kept = [(n, r) for n, r in zip(retrieved, expected) if r.kept]  # a node CANOPY leaves out is dropped
    assert len(kept) < len(retrieved)
    assert [(n.node.node_id, n.score) for n in out] == [(n.node.node_id, n.score) for n, _ in kept]
    for n, (_, r) in zip(out, kept):
        report = n.node.metadata["canopy"]
        assert n.node.get_content() == r.evidence.text
        assert report == {**canopy_ray.token_report([r]), "kept": [list(s) for s in r.kept]}
        assert n.node.metadata["source"] == "wiki" and report["compressed_tokens"] <= report["origin_tokens"]
        assert "canopy" not in n.node.get_content(metadata_mode=MetadataMode.LLM)  # not shown to the LLM
    total = canopy_ray.token_report(expected)
    assert total["compressed_tokens"] < total["origin_tokens"] and total["ratio"] > 1


def test_postprocessor_in_a_query_engine(index):
    engine = index.as_query_engine(llm=MockLLM(), similarity_top_k=2, node_postprocessors=[CanopyPostprocessor(config=F0)])
    response = engine.query(QUERY)  # MockLLM echoes its prompt: the compressed evidence
    sources = response.source_nodes
    assert sources[0].node.get_content() in str(response) and "origin_tokens" not in str(response)
    assert sources[0].node.ref_doc_id == "eiffel" and "canopy" in sources[0].node.metadata
    assert len(sources[0].node.get_content()) < len(DOCS[0][2])


def test_the_postprocessors_policy_replaces_the_configs(index):
    retrieved = index.as_retriever(similarity_top_k=3).retrieve(QUERY)
    items = [text_item(n.node.node_id, n.node.metadata["title"], n.node.get_content()) for n in retrieved]
    wide = CanopyPostprocessor(config=F0, policy="canopy margin=1").postprocess_nodes(retrieved, query_str=QUERY)
    expected = canopy_ray.compress(QUERY, items, config=F0, policy="canopy margin=1")
    # nothing beats a node by 1: every node kept whole, none dropped (the config's hybrid drops some)
    assert all(r.kept == [r.tree.root.span] for r in expected)
    assert [n.node.get_content() for n in wide] == [r.evidence.text for r in expected] and len(wide) == 3
    assert len(CanopyPostprocessor(config=F0).postprocess_nodes(retrieved, query_str=QUERY)) < 3
