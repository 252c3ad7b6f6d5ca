"""Settings in sections: every field in exactly one section, the same GROUNDWORK_* names, a section on its own."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from knowledge_store.config import settings as settings_module
from knowledge_store.config.settings import RankingSettings, ServerSettings, Settings, StorageSettings

SECTIONS = [cls for cls in Settings.__mro__ if isinstance(cls, type) and issubclass(cls, BaseModel)
            and cls.__module__ == settings_module.__name__ and cls.__name__.endswith("Settings") and cls is not Settings]


def test_every_setting_belongs_to_exactly_one_section():
    owners: dict[str, list[str]] = {}
    for section in SECTIONS:
        for name in section.model_fields:
            owners.setdefault(name, []).append(section.__name__)
    assert set(owners) == set(Settings.model_fields)
    assert {name: where for name, where in owners.items() if len(where) > 1} == {}
    assert len(SECTIONS) >= 10


def test_the_environment_names_stay_flat_and_a_section_reads_them(monkeypatch):
    monkeypatch.setenv("GROUNDWORK_DEFAULT_ALPHA", "0.4")
    monkeypatch.setenv("GROUNDWORK_SERVER_PORT", "9001")
    monkeypatch.setenv("GROUNDWORK_DATA_DIR", "/tmp/gw-sections")
    settings = Settings()
    ranking = settings.section(RankingSettings)
    assert type(ranking) is RankingSettings and ranking.default_alpha == 0.4
    assert not hasattr(ranking, "server_port")  # a section carries its own fields only
    assert settings.section(ServerSettings).server_port == 9001
    assert str(settings.section(StorageSettings).store_path) == "/tmp/gw-sections/store.duckdb"
    assert isinstance(settings, RankingSettings)  # code typed on a section takes the whole settings too


def test_a_bad_value_is_still_refused_with_its_setting_named(monkeypatch):
    monkeypatch.setenv("GROUNDWORK_DEFAULT_ALPHA", "1.5")
    with pytest.raises(Exception, match="default_alpha"):
        Settings()
