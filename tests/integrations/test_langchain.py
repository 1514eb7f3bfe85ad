"""CanopyCompressor in a real LangChain pipeline: ContextualCompressionRetriever over an
in-memory vector store with the packaged MiniLM; documents keep ids and metadata."""

import pytest

pytest.importorskip("langchain_core", reason="the langchain extra is not installed")

from langchain_core.documents import Document  # noqa: E402
from langchain_core.embeddings import Embeddings  # noqa: E402
from langchain_core.vectorstores import InMemoryVectorStore  # noqa: E402

import canopy_ray  # noqa: E402
from canopy_ray.integrations import text_item  # noqa: E402
from canopy_ray.integrations.langchain import CanopyCompressor  # noqa: E402

from tests.integrations.corpus import DOCS, F0, QUERY  # noqa: E402

pytestmark = pytest.mark.integration


class MiniLMEmbeddings(Embeddings):
    """LangChain embeddings from canopy-ray's packaged MiniLM (f0)."""

    def __init__(self, encoder):
        self.encoder = encoder

    def embed_documents(self, texts):
        return self.encoder.encode_queries(list(texts)).tolist()

    def embed_query(self, text):
        return self.embed_documents([text])[0]


def test_contextual_compression_retriever(minilm):
    retrievers = pytest.importorskip("langchain_classic.retrievers",
                                     reason="ContextualCompressionRetriever lives in langchain-classic")
    store = InMemoryVectorStore(MiniLMEmbeddings(minilm))
    store.add_documents([Document(page_content=text, metadata={"title": title, "source": "wiki"}, id=i)
                         for i, title, text in DOCS])
    base = store.as_retriever(search_kwargs={"k": 2})
    retriever = retrievers.ContextualCompressionRetriever(base_compressor=CanopyCompressor(config=F0), base_retriever=base)
    docs = retriever.invoke(QUERY)
    plain = base.invoke(QUERY)
    expected = canopy_ray.compress(QUERY, [text_item(d.id, d.metadata["title"], d.page_content) for d in plain],
                                   config=F0)
    kept = [r for r in expected if r.kept]  # a document CANOPY leaves out is dropped
    assert len(kept) < len(plain) and [d.id for d in docs] == [r.id for r in kept] and docs[0].id == "eiffel"
    for d, r in zip(docs, kept):
        assert d.page_content == r.evidence.text and d.metadata["source"] == "wiki"
        assert d.metadata["canopy"] == {**canopy_ray.token_report([r]), "kept": [list(s) for s in r.kept]}
    assert len(docs[0].page_content) < len(DOCS[0][2])


def test_empty_documents_pass_through_and_missing_ids_are_fine():
    docs = [Document(page_content=""), Document(page_content=DOCS[1][2], metadata={"title": "Saturn"})]
    out = CanopyCompressor().compress_documents(docs, "How many moons does Saturn have?")
    assert out[0] is docs[0] and out[1].id is None and out[1].metadata["title"] == "Saturn"
    assert out[1].metadata["canopy"]["origin_tokens"] >= out[1].metadata["canopy"]["compressed_tokens"] > 0


def test_the_compressors_policy_replaces_the_configs():
    docs = [Document(page_content=text, metadata={"title": title}, id=i) for i, title, text in DOCS]
    items = [text_item(i, title, text) for i, title, text in DOCS]
    wide = CanopyCompressor(config=F0, policy="canopy margin=1").compress_documents(docs, QUERY)
    expected = canopy_ray.compress(QUERY, items, config=F0, policy="canopy margin=1")
    # nothing beats a node by 1: every document kept whole, none dropped (the config's hybrid drops some)
    assert all(r.kept == [r.tree.root.span] for r in expected)
    assert [d.page_content for d in wide] == [r.evidence.text for r in expected] and len(wide) == len(docs)
    assert len(CanopyCompressor(config=F0).compress_documents(docs, QUERY)) < len(docs)
