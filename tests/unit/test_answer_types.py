"""``retrieval.answer_types``: the kind of value a question asks for, and whether a unit of text gives one."""

from __future__ import annotations

import pytest

from knowledge_store.retrieval.answer_types import (
    DURATION,
    FREQUENCY,
    MEASUREMENT,
    asked_action,
    asks_for_action,
    expected_answer_type,
    gives_instruction,
)


@pytest.mark.parametrize(("question", "kind"), [
    ("what pressure should the expansion vessel be", "measurement"),
    ("What is the API request limit?", "measurement"),
    ("what is the maximum file size for uploads", "measurement"),
    ("how many requests per second can a client send", "measurement"),
    ("how long can a file name be", "measurement"),  # a length, not a time
    ("how long does the inspection take", "duration"),
    ("how often should the pump be inspected", "frequency"),
    ("what does error E42 mean", None),
    ("do I need a C-wire", None),
    ("what changed in firmware 3.4", None),
    ("what is the best way to limit access", None),  # "limit" as a verb
    ("how do I reset the thermostat", None),
])
def test_a_question_asks_for_a_measurement_a_duration_a_frequency_or_none(question, kind):
    found = expected_answer_type(question)
    assert (found.name if found else None) == kind


@pytest.mark.parametrize(("text", "measurement", "duration", "frequency"), [
    ("Read the pre-charge pressure: it must be 1.0 bar, plus or minus 0.1 bar.", True, False, False),
    ("Each API client may send 10 requests per second.", True, False, False),
    ("Allow two hours with the heating off.", True, True, False),
    ("It takes an hour.", False, True, False),
    ("SOP-42 covers the yearly inspection.", False, False, True),
    ("Check the filter every 3 months.", True, True, True),
    # identifiers and versions are not values; "as" is not "a s(econd)"
    ("The expansion vessel ASSET-104 is inspected as API 510 describes.", False, False, False),
    ("Firmware 3.4 adds webhooks.", False, False, False),
    ("Step 2 in the manual names one of the files.", False, False, False),
    ("Upload at most 20 files of 50 MB each.", True, False, False),
])
def test_a_value_of_each_kind_is_told_from_identifiers_and_versions(text, measurement, duration, frequency):
    assert (MEASUREMENT.given_by(text), DURATION.given_by(text), FREQUENCY.given_by(text)) == \
        (measurement, duration, frequency)


@pytest.mark.parametrize(("question", "asks"), [
    ("how do I clear E55", True),
    ("How can I become a Debian developer?", True),
    ("How to rotate an API key", True),
    ("what should I do when the display shows E47", True),
    ("what does E55 mean", False),
    ("how long does the inspection take", False),
    ("how often should the pump be inspected", False),
])
def test_a_question_asks_what_to_do_or_not(question, asks):
    assert asks_for_action(question) is asks


@pytest.mark.parametrize(("question", "verb"), [
    ("how do I clear E55", "clear"),
    ("How can I become a Debian developer?", "become"),
    ("How to rotate an API key", "rotate"),
    ("steps to install the thermostat", "install"),
    ("how do I safely drain the tank", "drain"),
    ("what should I do when the display shows E47", None),
    ("what does E55 mean", None),
])
def test_the_verb_a_how_question_asks_to_do(question, verb):
    assert asked_action(question) == verb


@pytest.mark.parametrize(("text", "instructs"), [
    ("The installer must either remove the O/B wire or set the system type to heat pump.", True),
    ("To reset the Aurora to factory settings, press and hold the dial.", True),
    ("1. Switch off power to the HVAC system.", True),
    ("Use the glob() operator, documented in perlfunc.", True),
    ("You can run perl -de 0 to get a debugger.", True),
    ("The fault is cleared by removing the wire.", True),
    ("E55 is shown when a wire is detected on the O/B terminal.", False),
    ("Energising a reversing valve by mistake can damage a heat pump.", False),  # "can" of a thing, not of a reader
    ("The pump should be inspected every year.", False),  # says when, not what to do
    ("Note that older versions behave differently.", False),
])
def test_a_unit_says_what_to_do_or_not(text, instructs):
    assert gives_instruction(text) is instructs
