"""embedder.json says when a fine-tuned model was adopted: when its run adopted it, not when that run began."""

from __future__ import annotations

from knowledge_store.config.settings import Settings
from knowledge_store.learning import finetune
from knowledge_store.models.serving import load_record


def test_the_adoption_time_is_when_the_model_was_adopted_and_stays_while_it_serves(tmp_path, monkeypatch):
    settings = Settings(data_dir=tmp_path)
    settings.index_dir.mkdir(parents=True)
    decision = finetune.Decision(decision="adopted", reason="adopted", base_model_id="base:1",
                                 created_at="2026-01-01T10:00:00+00:00")
    monkeypatch.setattr(finetune, "_now", lambda: "2026-01-01T11:40:00+00:00")
    finetune._record(settings, decision, "/models/ft-1", "ft-1:1")  # the model is named before the switch
    monkeypatch.setattr(finetune, "_now", lambda: "2026-01-01T11:45:00+00:00")
    finetune._record(settings, decision, "/models/ft-1", "ft-1:1", replace_last=True)  # the run finishes
    assert load_record(settings.index_dir).adopted_at == "2026-01-01T11:40:00+00:00"
    later = finetune.Decision(decision="adopted", reason="adopted", base_model_id="base:1",
                              created_at="2026-01-02T09:00:00+00:00")
    monkeypatch.setattr(finetune, "_now", lambda: "2026-01-02T10:30:00+00:00")
    finetune._record(settings, later, "/models/ft-2", "ft-2:1")  # another model replaces it
    assert load_record(settings.index_dir).adopted_at == "2026-01-02T10:30:00+00:00"
