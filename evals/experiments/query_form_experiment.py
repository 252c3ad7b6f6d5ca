"""Does the question's wording hurt its vector?  Measured on both dev sets.

Documentation questions open with "How do I …", "Why does …", "Is there …"; the answer
sections never do.  BM25 already drops those words (all are in the fts English stop list,
checked here), so only the vector side could gain.  This ranks each split's queries with the
default ranking (``RankingPipeline``, feedback step included) with three query vectors:

- ``as asked``: the question embedded as typed (what the engine does);
- ``stripped``: the leading question phrase removed ("How do I install X?" → "install X");
- ``mean``: the normalised mean of the two.

    .venv/bin/python -m evals.experiments.query_form_experiment scifact:train debian:train debian:test scifact
"""

from __future__ import annotations

import re
import sys

import numpy as np

from evals.experiments.adapter_eval import ranked_rows
from evals.experiments.dev_store import open_dev_store
from knowledge_store.config.settings import Settings

# A leading interrogative, its auxiliary and a pronoun subject: "how do i", "why does",
# "what is the", "is there a way to", "can i".  Longest alternatives first.
QUESTION_LEAD = re.compile(
    r"^\s*(?:"
    r"(?:how|why|what|when|where|which|who)(?:\s+(?:much|many|long|kind\s+of))?"
    r"(?:\s+(?:do|does|did|can|could|should|would|will|is|are|was|were|has|have|must|may))?"
    r"|(?:do|does|did|can|could|should|would|will|is|are|was|were|has|have|must|may)"
    r")\s+(?:(?:i|you|we|one|it|there|the|a|an)\s+)?(?:(?:a\s+way\s+to|possible\s+to|able\s+to)\s+)?",
    re.IGNORECASE,
)


def strip_question(text: str) -> str:
    """The question without its leading interrogative phrase and trailing '?'.

    Only questions (text ending in '?') are reworded; anything left shorter than two words is kept as asked.
    """
    if not text.rstrip().endswith("?"):
        return text
    stripped = QUESTION_LEAD.sub("", text, count=1).rstrip(" ?").strip()
    return stripped if len(stripped.split()) >= 2 else text


def run(name: str) -> dict[str, tuple[float, float]]:
    dev = open_dev_store(name)
    dataset, snapshot, params = dev.dataset, dev.snapshot, dev.params
    settings = Settings()
    ids = list(dataset.queries)
    asked = dev.embedder.embed([dataset.queries[i] for i in ids])
    stripped_texts = [strip_question(dataset.queries[i]) for i in ids]
    changed = sum(s != dataset.queries[i] for s, i in zip(stripped_texts, ids))
    stripped = dev.embedder.embed(stripped_texts)
    mean = asked + stripped
    mean = mean / np.linalg.norm(mean, axis=1, keepdims=True)
    forms = {"as asked": asked, "stripped": stripped, "mean": mean}
    out = {}
    for form, vectors in forms.items():
        out[form] = dev.mean_scores(
            (qid, dev.ranked_docs(ranked_rows(snapshot, dataset.queries[qid], vector.astype(np.float32), params, settings)))
            for qid, vector in zip(ids, vectors))
        print(f"  {name} ({changed}/{len(ids)} queries reworded): {form}: "
              f"nDCG@10 {out[form][0]:.4f}  Recall@5 {out[form][1]:.4f}", flush=True)
    return out


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        run(arg)
