"""The query side: snapshot reading, hybrid search, fusion, rerankers, citations, answers."""
