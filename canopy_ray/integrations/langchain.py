"""LangChain: :class:`CanopyCompressor`, CANOPY as a document compressor.

    from langchain_classic.retrievers import ContextualCompressionRetriever
    from canopy_ray.integrations.langchain import CanopyCompressor
    retriever = ContextualCompressionRetriever(base_compressor=CanopyCompressor(),
                                               base_retriever=vector_store.as_retriever())
    docs = retriever.invoke(question)

Needs ``langchain-core`` (``pip install "canopy-ray[langchain]"``); LangChain 1.x keeps
``ContextualCompressionRetriever`` in ``langchain-classic``. See :mod:`canopy_ray.integrations`
for what happens to each document.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from langchain_core.callbacks import Callbacks
from langchain_core.documents import BaseDocumentCompressor, Document

from canopy_ray.integrations import REPORT_KEY, compress_texts, left_out


class CanopyCompressor(BaseDocumentCompressor):
    """Replaces each document's ``page_content`` by CANOPY's kept evidence for the query (a
    document it leaves out is dropped); ``id`` and metadata stay, ``metadata["canopy"]`` gets
    the token report."""

    url: Optional[str] = None  # a served engine (canopy serve); None: this process
    config: Any = None  # in process: a YAML path or CanopyConfig (default: the CPU defaults)
    branching: Optional[int] = None  # B, children per tree node (default: the config's)
    policy: Optional[str] = None  # refinement.policy, e.g. "canopy margin=0.05" (default: the config's)
    title_key: str = "title"  # the metadata key holding a document's title

    def compress_documents(self, documents: Sequence[Document], query: str,
                           callbacks: Callbacks | None = None) -> Sequence[Document]:
        texts = [(d.id, str(d.metadata.get(self.title_key) or ""), d.page_content) for d in documents]
        done = compress_texts(query, texts, url=self.url, config=self.config, branching=self.branching,
                              policy=self.policy)
        return [d if result is None else
                d.model_copy(update={"page_content": result[0], "metadata": {**d.metadata, REPORT_KEY: result[1]}})
                for d, result in zip(documents, done) if not left_out(result)]
