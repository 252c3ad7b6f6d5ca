"""Query terms, snippets, citations and extractive answers (the LLM client against a local fake server is
in tests/integration/test_citations_answer.py)."""

from __future__ import annotations

import json
import random

import pytest

from knowledge_store.retrieval.answer import NO_ANSWER, Answer, extractive_answer
from knowledge_store.retrieval.citations import Citation, build_citation, build_citations
from knowledge_store.retrieval.snippets import ELLIPSIS, best_snippet, collapse_ws, segments
from knowledge_store.retrieval.terms import query_terms, term_spans
from tests.helpers import hits_for_answer, make_hit


def check_offsets(text: str, snippet: str, start: int, end: int) -> None:
    """The snippet minus its ellipses is exactly the collapsed text[start:end]."""
    assert 0 <= start < end <= len(text)
    body = collapse_ws(text[start:end])
    assert snippet in {body, ELLIPSIS + body, body + ELLIPSIS, ELLIPSIS + body + ELLIPSIS}, (snippet, body)


# ---------------------------------------------------------------------------
# query terms


def test_query_terms_stem_stopwords_and_identifiers():
    assert query_terms("How do I reset the thermostat?") == ["reset", "thermostat"]
    assert query_terms("resetting") == query_terms("reset") == query_terms("resets")
    assert query_terms("codes") == query_terms("code") == query_terms("coding")
    assert query_terms("configured") == query_terms("configuration") == query_terms("configure")
    assert query_terms("What is hvac.min_cycle_minutes?") == ["hvac", "min_cycle_minutes"]
    assert query_terms("Café RÉSUMÉ") == query_terms("cafe resume")
    assert query_terms("the of and is") == []
    assert query_terms("error E42 error") == ["error", "e42"]


# ---------------------------------------------------------------------------
# snippets

VOCAB = (
    "the thermostat controller reset button press hold seconds error code codes display battery sensor "
    "schedule heating cooling fan mode minutes cycle compressor filter warranty service manual install "
    "wiring voltage terminal café naïve résumé Straße 温度 計 données élève ünïcödé"
).split()
CODE_LINES = [
    "hvac.min_cycle_minutes = 5",
    "    if error_code == 42: reset()",
    "| code | meaning | action |",
    "def reset_controller(timeout=30):",
    "curl -X POST http://localhost:8080/api/v1/reset?force=true",
]
LONG_WORDS = [
    "https://example.com/manuals/thermostat/" + "x" * 120 + "/reset.pdf",
    "a" * 300,
    "sha256:" + "0123456789abcdef" * 8,
]


def random_text(rng: random.Random) -> str:
    parts: list[str] = []
    for _ in range(rng.randint(1, 8)):
        kind = rng.random()
        if kind < 0.6:
            n = rng.choice([3, 8, 15, 40, 90])  # some sentences far longer than a snippet
            words = [rng.choice(VOCAB) for _ in range(rng.randint(1, n))]
            if rng.random() < 0.1:
                words.insert(rng.randrange(len(words) + 1), rng.choice(LONG_WORDS))
            sentence = " ".join(words)
            parts.append(sentence[0].upper() + sentence[1:] + rng.choice([".", "!", "?", ";", ""]))
        elif kind < 0.85:
            parts.append("\n".join(rng.sample(CODE_LINES, rng.randint(1, len(CODE_LINES)))))
        else:
            parts.append(rng.choice(LONG_WORDS) + " 🙂 e.g. see fig. 3")
        parts.append(rng.choice([" ", "  ", "\n", "\n\n", " \t\n  "]))
    return "".join(parts)


def random_query(rng: random.Random) -> str:
    pool = VOCAB + ["hvac.min_cycle_minutes", "resetting", "E42", "absent", "what is the", "how do I"]
    return " ".join(rng.choice(pool) for _ in range(rng.randint(1, 4)))


def test_snippet_limits_offsets_and_terms_on_random_texts():
    rng = random.Random(20240611)
    for _ in range(600):
        text = random_text(rng)
        query = random_query(rng)
        max_chars = rng.choice([150, 150, 150, 60, 25, 200])
        snippet, start, end = best_snippet(text, query, max_chars)
        assert snippet, (text, query)
        assert len(snippet) <= max_chars, (snippet, max_chars)
        assert "\n" not in snippet and "  " not in snippet
        check_offsets(text, snippet, start, end)
        wanted = set(query_terms(query))
        present = wanted & {t for t, _, _ in term_spans(text)}
        if present and max_chars >= 60:
            assert wanted & set(query_terms(snippet)), (text, query, snippet)


def test_snippet_default_limit_is_150():
    text = " ".join(["word"] * 200) + " thermostat " + " ".join(["word"] * 200)
    snippet, start, end = best_snippet(text, "thermostat")
    assert len(snippet) <= 150 and "thermostat" in snippet
    assert snippet.startswith(ELLIPSIS) and snippet.endswith(ELLIPSIS)
    check_offsets(text, snippet, start, end)
    # centred: roughly as many words on each side of the match
    left, right = snippet.strip(ELLIPSIS).split("thermostat")
    assert abs(len(left) - len(right)) <= 12


def test_snippet_fills_its_limit_with_neighbouring_sentences_however_much_whitespace_separates_them():
    # a snippet reads only the words it can reach from its unit; whitespace runs collapse to one space in it, so
    # what it can reach is counted in words, not in the passage's characters
    sentences = [f"Note {n} here." for n in range(60)]
    sentences[30] = "Thermostat fact."
    text = (" " * 40).join(sentences)
    snippet, start, end = best_snippet(text, "thermostat", 150)
    check_offsets(text, snippet, start, end)
    assert "Thermostat fact." in snippet
    assert 150 - len("Note 31 here. ") < len(snippet) <= 150, snippet
    left, right = snippet.split("Thermostat fact.")
    assert left.count("Note") >= 3 and right.count("Note") >= 3


def test_best_sentence_is_chosen():
    text = (
        "The unit ships with a wall plate. Batteries last about a year. "
        "To reset the controller, hold the MODE button for ten seconds. "
        "The warranty covers parts for five years."
    )
    snippet, start, end = best_snippet(text, "how do I reset the controller?", 150)
    assert "To reset the controller, hold the MODE button for ten seconds." in snippet
    check_offsets(text, snippet, start, end)
    exact = "To reset the controller, hold the MODE button for ten seconds."
    snippet, start, end = best_snippet(text, "resetting controller", len(exact))
    assert snippet == exact and text[start:end] == exact


def test_rare_terms_weigh_more_and_ties_go_earlier():
    text = "Thermostat battery notes. Thermostat wiring guide. Thermostat error codes list."
    snippet, _, _ = best_snippet(text, "thermostat error", 30)
    assert snippet == "Thermostat error codes list."
    snippet, _, _ = best_snippet(text, "thermostat", 30)
    assert snippet.startswith("Thermostat battery notes.")


def test_short_sentence_is_extended_with_neighbours():
    text = "Intro sentence here. Press reset. Then wait for the display to blink twice before releasing."
    snippet, start, end = best_snippet(text, "reset", 150)
    assert snippet == collapse_ws(text) and (start, end) == (0, len(text))
    snippet, start, end = best_snippet(text, "reset", 45)
    assert "Press reset." in snippet and len(snippet) <= 45
    check_offsets(text, snippet, start, end)


def test_long_sentence_window_has_ellipses_and_cuts_at_words():
    words = [f"filler{i}" for i in range(60)]
    words[45] = "compressor"
    text = "Short first. " + " ".join(words) + " end. Last one."
    snippet, start, end = best_snippet(text, "compressor", 80)
    assert len(snippet) <= 80 and "compressor" in snippet
    assert snippet.startswith(ELLIPSIS) and snippet.endswith(ELLIPSIS)
    check_offsets(text, snippet, start, end)
    assert text[start - 1] == " " and text[end] == " "  # whole words only


def test_code_lines_count_as_sentences():
    text = (
        "Configuration keys:\n"
        "hvac.fan_mode = auto\n"
        "hvac.min_cycle_minutes = 5\n"
        "hvac.max_temp = 30\n\n"
        "Restart the service after editing."
    )
    spans = [text[s:e] for s, e in segments(text)]
    assert "hvac.min_cycle_minutes = 5" in spans
    snippet, start, end = best_snippet(text, "hvac.min_cycle_minutes", 26)
    assert snippet == "hvac.min_cycle_minutes = 5"
    assert text[start:end] == snippet


def test_hard_wrapped_prose_stays_one_sentence():
    text = "The compressor restarts only after the minimum\ncycle time has elapsed, which protects\nthe motor."
    assert [text[s:e] for s, e in segments(text)] == [text]


def test_no_match_gives_first_sentence_and_empty_text_gives_empty():
    text = "First sentence is here. Second sentence follows."
    snippet, start, end = best_snippet(text, "zebra", 24)
    assert snippet == "First sentence is here." and start == 0
    assert best_snippet("", "zebra") == ("", 0, 0)
    assert best_snippet("   \n ", "zebra") == ("", 0, 0)
    with pytest.raises(ValueError):
        best_snippet(text, "x", 0)


def test_single_huge_word_is_cut_around_the_match():
    text = "See " + "q" * 200 + "/thermostat/" + "z" * 200 + " for details."
    snippet, start, end = best_snippet(text, "thermostat", 40)
    assert len(snippet) <= 40 and "thermostat" in snippet
    assert snippet.startswith(ELLIPSIS) and snippet.endswith(ELLIPSIS)
    assert snippet.strip(ELLIPSIS) == text[start:end]


# ---------------------------------------------------------------------------
# citations


def test_build_citation_fields_and_json():
    text = "Intro. To reset the controller, hold MODE for ten seconds. Outro."
    hit = make_hit(text, 2, section_path=("Manual", "Reset"), last_updated="2024-05-01", rerank_score=0.7)
    citation = build_citation(hit, "reset controller", 3)
    assert isinstance(citation, Citation)
    assert citation.n == 3 and citation.chunk_id == "c2" and citation.doc_id == "d2"
    assert citation.pages == [2] and citation.page_start == 2 and citation.page_end == 2
    assert citation.section_path == ["Manual", "Reset"]
    assert citation.url == "file:///docs/doc2.pdf#page=2"
    assert "reset the controller" in citation.snippet
    assert text[citation.snippet_start:citation.snippet_end] in text
    assert citation.rerank_score == 0.7 and citation.last_updated == "2024-05-01"
    data = json.loads(citation.model_dump_json())
    assert data["n"] == 3 and data["snippet"] == citation.snippet and data["bm25_score"] == 3.0


def test_citation_url_gets_page_fragment_only_when_missing():
    plain = make_hit("Some text.", 1, url="file:///docs/a.pdf", page_start=4, page_end=5)
    assert build_citation(plain, "text", 1).url == "file:///docs/a.pdf#page=4"
    assert build_citation(plain, "text", 1).pages == [4, 5]
    anchored = make_hit("Some text.", 1, url="file:///docs/a.md#install", page_start=1, page_end=1)
    assert build_citation(anchored, "text", 1).url == "file:///docs/a.md#install"
    no_page = make_hit("Some text.", 1, url="file:///docs/a.md", page_start=None, page_end=None)
    citation = build_citation(no_page, "text", 1)
    assert citation.url == "file:///docs/a.md" and citation.pages == []


def test_build_citations_numbers_in_rank_order_and_respects_limit():
    hits = [make_hit("Alpha reset step. " * 20, 1), make_hit("Beta reset step.", 2)]
    citations = build_citations(hits, "reset")
    assert [c.n for c in citations] == [1, 2] and [c.chunk_id for c in citations] == ["c1", "c2"]
    assert all(len(c.snippet) <= 150 for c in citations)
    assert all(len(c.snippet) <= 40 for c in build_citations(hits, "reset", max_snippet_chars=40))


# ---------------------------------------------------------------------------
# extractive answers

def test_extractive_sentences_are_quoted_with_the_right_marker():
    hits = hits_for_answer()
    answer = extractive_answer("How do I reset the controller?", hits)
    assert answer.method == "extractive" and answer.model is None
    assert answer.sentences
    for item in answer.sentences:
        hit = hits[item["citation"] - 1]
        assert item["chunk_id"] == hit.chunk_id and item["kind"] == "sentence"
        assert item["text"] in collapse_ws(hit.text)  # no markup here: the quote is the text itself
        assert collapse_ws(hit.text[item["start"]:item["end"]]) == item["text"]
        assert f"{item['text']} [{item['citation']}]" in answer.text
    assert 0.0 < answer.confidence <= 1.0
    texts = [item["text"] for item in answer.sentences]
    best = "To reset the controller, hold the MODE button for ten seconds."
    assert best in texts and answer.sentences[texts.index(best)]["citation"] == 1  # the top hit's copy
    # the same sentence in hit 2 (chunk overlap) is not repeated
    assert texts.count("To reset the controller, hold the MODE button for ten seconds.") == 1
    assert "Reset" not in texts  # the heading is not an answer sentence
    assert set(answer.citations) == {item["citation"] for item in answer.sentences}


def test_extractive_cites_the_hit_that_holds_the_fact():
    hits = hits_for_answer()
    answer = extractive_answer("what does error E42 mean", hits, max_sentences=1)
    assert answer.text == "Error E42 means the outdoor sensor is disconnected. [2]"
    assert answer.citations == [2]
    answer = extractive_answer("warranty parts years", hits, max_sentences=1)
    assert answer.text.endswith("[3]") and answer.citations == [3]


def test_extractive_keeps_passage_order_and_limits():
    hits = hits_for_answer()
    answer = extractive_answer("controller reset display blinks", hits, max_sentences=3)
    first_hit = [item for item in answer.sentences if item["citation"] == 1]
    assert [item["start"] for item in first_hit] == sorted(item["start"] for item in first_hit)
    assert len(answer.sentences) <= 3
    short = extractive_answer("controller reset display blinks", hits, max_chars=80)
    assert len(short.text) <= 80 and short.sentences
    one = extractive_answer("controller reset display blinks", hits, max_sentences=1)
    assert len(one.sentences) == 1


def test_extractive_long_sentence_is_quoted_in_part():
    hit = make_hit("Intro. " + "The compressor " + " ".join(["waits"] * 200) + " before restarting.", 1)
    answer = extractive_answer("compressor", [hit], max_chars=100)
    assert len(answer.text) <= 100 and "compressor" in answer.text and answer.text.endswith("[1]")


def test_extractive_empty_and_unmatched():
    answer = extractive_answer("anything", [])
    assert answer == Answer(text=NO_ANSWER, citations=[], method="extractive")
    hits = hits_for_answer()
    fallback = extractive_answer("zebra giraffe", hits)
    assert fallback.citations == [1]
    assert fallback.text == "The controller keeps its schedule during a power cut. [1]"


# ---------------------------------------------------------------------------
# what an extractive answer quotes


ERROR_TABLE = ("Error codes\n\nWhen the thermostat detects a fault it shows a code on the display. Codes clear "
               "automatically once the cause is gone.\n\nCode | Meaning | What to do\n"
               "E10 | No 24 V AC supply on R/C | See The screen is blank\n"
               "E47 | No contact with the Aurora Hub for more than 15 minutes | See offline steps\n"
               "E71 | Firmware image failed verification | Retry the update")


def test_a_table_row_is_quoted_with_its_header_never_the_header_alone():
    hit = make_hit(ERROR_TABLE, 1, section="Error codes", section_path=("Troubleshooting", "Error codes"))
    answer = extractive_answer("What does error E47 mean?", [hit])
    assert answer.text == ("E47 \u2014 Meaning: No contact with the Aurora Hub for more than 15 minutes; "
                           "What to do: See offline steps [1]")
    assert answer.sentences[0]["kind"] == "row"
    assert ERROR_TABLE[answer.sentences[0]["start"]:answer.sentences[0]["end"]].startswith("E47 | No contact")
    # "meaning" is in every row and in the header: neither the header nor a row about another code is quoted
    assert "Code | Meaning" not in extractive_answer("What does the meaning column mean?", [hit]).text


def test_headings_intros_fragments_and_code_are_never_quoted_even_when_they_hold_the_query():
    text = ("### Rate limits\n\nRate limits of the API:\n\n```\nrate limits = 10/s\n```\n\n"
            "limits are per client and\n\nEach API client may send 10 requests per second with bursts of up to 20.")
    hit = make_hit(text, 1, section="Rate limits", section_path=("API Guide", "Rate limits"))
    answer = extractive_answer("What are the rate limits of the API?", [hit])
    assert answer.text == "Each API client may send 10 requests per second with bursts of up to 20. [1]"


def test_markup_is_removed_from_quoted_text():
    text = ("The documents describe **fictional** products of the `Corvane` company; see the [FAQ](faq.md) "
            "&amp; the <em>manual</em>.")
    answer = extractive_answer("Which products are fictional?", [make_hit(text, 1)])
    assert answer.text == "The documents describe fictional products of the Corvane company; see the FAQ & the manual. [1]"
    assert (answer.sentences[0]["start"], answer.sentences[0]["end"]) == (0, len(text))


def test_a_numbered_step_stays_a_step_and_comes_before_the_introduction_that_repeats_the_heading():
    text = ("The expansion vessel ASSET-104 is a pressure vessel and is inspected in service by a certified inspector."
            "\n\n1. Close the isolation valve under the vessel.\n2. Read the pre-charge pressure at the gas valve: it\n"
            "   must be 1.0 bar, plus or minus 0.1 bar. Recharge with nitrogen if it is low.\n"
            "3. Refill the system to 1.5 bar.")
    hit = make_hit(text, 1, section="Expansion vessel", section_path=("SOP-42", "Expansion vessel"))
    answer = extractive_answer("What pre-charge pressure should the expansion vessel have?", [hit])
    assert answer.sentences[0]["kind"] == "item"  # the answer leads with what answers
    assert answer.text.startswith("2. Read the pre-charge pressure at the gas valve: it must be 1.0 bar, plus or "
                                  "minus 0.1 bar. Recharge with nitrogen if it is low. [1]")


def test_the_sentence_that_continues_the_best_one_is_quoted_when_it_shares_the_question_s_focus():
    text = ("Each API client may send 10 requests per second with bursts of up to 20. Requests above the limit are "
            "answered with 429 Too Many Requests and a Retry-After header. The Hub logs every request in its "
            "diagnostics page. Timestamps are in UTC.")
    spans = [(0, 72), (73, 163), (164, 215), (216, len(text))]
    assert [text[s:e] for s, e in spans][1].startswith("Requests above")
    cosines = tuple((s, e, c) for (s, e), c in zip(spans, (0.62, 0.55, 0.35, 0.15)))  # as the engine attaches them
    hit = make_hit(text, 1, section="Rate limits", section_path=("API Guide", "Rate limits"), sentence_cosines=cosines)
    answer = extractive_answer("What is the request limit, and what happens above it?", [hit])
    assert [item["text"] for item in answer.sentences][:2] == [
        "Each API client may send 10 requests per second with bursts of up to 20.",
        "Requests above the limit are answered with 429 Too Many Requests and a Retry-After header."]
    assert "Timestamps" not in answer.text and "diagnostics" not in answer.text


def test_a_query_that_names_something_is_answered_from_where_it_is_named():
    """A general sentence holding the question's common words does not beat the section the question names."""
    general = make_hit("These notes describe the changes in each firmware release, newest first.", 1,
                       section="Release notes", section_path=("Release notes",))
    named = make_hit("Version 3.4\n\nReleased: 10 September 2024.\n\nFirmware 3.4 adds webhooks to the Hub and "
                     "cuts its start-up time to 20 seconds.", 2, section="Version 3.4", section_path=("Version 3.4",))
    other = make_hit("Version 3.3\n\nFirmware 3.3 adds a screen lock with a 4-digit PIN.", 3, section="Version 3.3",
                     section_path=("Version 3.3",))
    answer = extractive_answer("What changed in firmware 3.4?", [general, other, named])
    assert answer.text == "Firmware 3.4 adds webhooks to the Hub and cuts its start-up time to 20 seconds. [3]"


def test_each_sentence_s_own_vector_evidence_picks_among_sentences_sharing_the_query_s_words():
    text = ("The thermostat stores its schedule in flash memory. The thermostat keeps its schedule during a power cut "
            "for up to 48 hours.")
    first, second = (0, text.index(" The thermostat keeps")), (text.index("The thermostat keeps"), len(text))
    plain = make_hit(text, 1)
    assert extractive_answer("thermostat schedule", [plain], max_sentences=1).text.startswith("The thermostat stores")
    with_vectors = make_hit(text, 1, sentence_cosines=((*first, 0.30), (*second, 0.65)))
    assert extractive_answer("thermostat schedule", [with_vectors], max_sentences=1).text.startswith(
        "The thermostat keeps")


def test_confidence_says_how_well_the_quoted_sentences_answer():
    """The right section quoted: high support; only passages from neighbouring sections: not high, whatever the
    passages' own scores say."""
    right = make_hit("Each API client may send 10 requests per second. Requests above the limit are answered with 429.",
                     1, section="Rate limits", section_path=("API Guide", "Rate limits"), vector_score=0.55,
                     relevance=0.9)
    wrong = make_hit("A Hub accepts at most 5 API clients. Each client gets its own secret.", 1,
                     section="Creating an API client", section_path=("API Guide", "Authentication"),
                     vector_score=0.55, relevance=0.9)  # the same topic, as close in meaning
    question = "What is the request limit of the API and what happens above it?"
    answered, missed = extractive_answer(question, [right]).confidence, extractive_answer(question, [wrong]).confidence
    assert answered >= 0.55 > missed and answered - missed > 0.2


def test_coverage_is_capped_by_what_the_quoted_sentences_support():
    from knowledge_store.retrieval.engine import answered_coverage

    assert answered_coverage("high", 0.9) == "high"
    assert answered_coverage("high", 0.6) == "medium"  # the passages match, their sentences answer less
    assert answered_coverage("high", 0.2) == "low"  # shown (the passages passed the floor), never "high"
    assert answered_coverage("medium", 0.95) == "medium"  # support never raises what the passages say
    assert answered_coverage("none", 0.95) == "none"


def test_a_question_that_asks_for_a_value_is_answered_by_the_unit_that_gives_one():
    """The introduction holds all of the question's words and names the thing; the step that gives the value
    holds one of them itself and the others in its section's heading - it answers, and the answer that gives no
    value is less sure of itself."""
    text = ("The expansion vessel ASSET-104 is a pressure vessel and is inspected in service as API 510 describes."
            "\n\n1. Close the isolation valve under the vessel.\n2. Read the pre-charge pressure at the gas valve: it\n"
            "   must be 1.0 bar, plus or minus 0.1 bar.\n3. Look for corrosion on the shell.")
    hit = make_hit(text, 1, section="Expansion vessel", section_path=("SOP-42", "Expansion vessel"))
    answer = extractive_answer("what pressure should the expansion vessel be", [hit])
    assert answer.text == ("2. Read the pre-charge pressure at the gas valve: it must be 1.0 bar, plus or minus 0.1 "
                           "bar. [1]")
    intro_only = make_hit(text.split("\n\n")[0], 1, section="Expansion vessel")
    unanswered = extractive_answer("what pressure should the expansion vessel be", [intro_only])
    assert unanswered.text.startswith("The expansion vessel ASSET-104")  # nothing gives a value: the best there is
    named = extractive_answer("is the expansion vessel a pressure vessel", [intro_only])
    assert unanswered.confidence < named.confidence  # the same unit answers a question that asks for no value


def test_a_duration_question_is_answered_from_its_subject_not_from_another_passage_sharing_its_verb():
    """"how long does the inspection take": "take" asks for a duration as "how long" does, so the second
    passage's "takes about 45 minutes" (installing, not inspecting) holds none of what the question is about,
    while "Allow two hours" sits under the inspection's heading."""
    inspection = make_hit("SOP-42 covers the yearly inspection of the plant room: the expansion vessel and the pump. "
                          "Allow two hours with the heating off. Records are kept as ISO 9001 requires.", 1,
                          section="Annual Inspection of the Plant Room",
                          section_path=("SOP-42 Annual Inspection of the Plant Room",))
    installing = make_hit("Installing the Aurora takes about 45 minutes for a typical single-stage system.", 2,
                          section="Installation", section_path=("Installation",))
    answer = extractive_answer("how long does the inspection take", [inspection, installing])
    assert "Allow two hours with the heating off." in answer.text and "45 minutes" not in answer.text


def test_a_sentence_pointing_to_another_section_does_not_answer_before_the_section_it_points_to():
    """"Codes E42 and E55 take more than one step to clear, so each has a section of its own below." holds both of
    "how do I clear E55"'s words, but it only says where the answer is: its words count as a heading's would, and
    the E55 section, which names the code and says what to do, answers."""
    codes = make_hit("| Code | Meaning |\n|---|---|\n| E47 | No contact with the Hub |\n\n"
                     "Codes E42 and E55 take more than one step to clear, so each has a section of its own below.", 1,
                     section="Error codes", section_path=("Troubleshooting", "Error codes"))
    e55 = make_hit("E55 is shown when a wire is detected on the O/B terminal but the system type is set to "
                   "conventional. The installer must either remove the O/B wire or set the system type to heat pump.",
                   2, section="E55 - Wiring conflict", section_path=("Troubleshooting", "E55 - Wiring conflict"))
    answer = extractive_answer("how do I clear E55", [codes, e55])
    assert "section of its own below" not in answer.text and answer.text.startswith("E55 is shown when"), answer.text
    alone = extractive_answer("how do I clear E55", [codes])  # nothing else holds the words: it still answers
    assert "section of its own below" in alone.text


def test_a_how_question_is_answered_with_what_to_do_from_the_best_sentence_s_paragraph():
    """"how do I clear E55": the sentence naming E55 best says what it means; the instruction in the same paragraph,
    holding none of the question's words, is quoted beside it.  A question that asks what E55 means gets the
    meaning alone, and an instruction in another paragraph is not pulled in."""
    e55 = make_hit("E55 is shown when a wire is detected on the O/B terminal but the system type is set to "
                   "conventional. Heating and cooling are blocked until the conflict is resolved, because energising "
                   "a reversing valve by mistake can damage a heat pump. The installer must either remove the O/B "
                   "wire or set the system type to heat pump.\n\nAfter that, run the setup wizard again.", 1,
                   section="E55 - Wiring conflict", section_path=("Troubleshooting", "E55 - Wiring conflict"))
    how = extractive_answer("how do I clear E55", [e55])
    assert how.text.startswith("E55 is shown when"), how.text
    assert "The installer must either remove the O/B wire" in how.text, how.text
    assert "can damage" not in how.text and "setup wizard" not in how.text, how.text
    what = extractive_answer("what does E55 mean", [e55])
    assert "The installer must" not in what.text, what.text


def test_a_quoted_instruction_holds_the_verb_a_how_question_asks():
    """"how do I clear E55" answered with "The installer must either remove the O/B wire ..." holds what was
    asked, though no passage says "clear": the answer's confidence counts the verb as held, as it counts E55.  An
    answer with no instruction in it does not, and the same quoted units without the asked verb score lower."""
    import dataclasses

    from knowledge_store.retrieval.answer import answer_evidence, choose_answer_units

    e55 = make_hit("E55 is shown when a wire is detected on the O/B terminal but the system type is set to "
                   "conventional. The installer must either remove the O/B wire or set the system type to heat "
                   "pump.", 1, section="E55 - Wiring conflict", section_path=("Troubleshooting", "E55 - Wiring conflict"))
    evidence = answer_evidence("how do I clear E55", [e55])
    assert evidence.action == {"clear"}
    chosen = choose_answer_units(evidence)
    without_verb = dataclasses.replace(evidence, action=frozenset()).confidence(chosen)
    assert evidence.confidence(chosen) > without_verb + 0.1, (evidence.confidence(chosen), without_verb)
    meaning_only = [c for c in chosen if c.unit.text.startswith("E55 is shown")]
    assert evidence.confidence(meaning_only) == dataclasses.replace(evidence, action=frozenset()).confidence(
        meaning_only)


def test_comparisons_with_below_and_above_are_not_pointers():
    from knowledge_store.retrieval.answer import points_elsewhere

    for text in ("Requests above the limit are answered with 429.", "Heating starts when the room falls below the "
                 "setpoint.", "If it is below 20 V AC, replace the transformer.", "lowering it below 5 minutes",
                 # a cross-reference inside a sentence that says something
                 "Using intrusion detection systems (see Section 10.3), you may be able to trace an attack.",
                 "The pool directory contains the actual packages, see Section 6.10."):
        assert not points_elsewhere(text), text
    for text in ("Each has a section of its own below.", "The codes are listed below:", "as described above; the "
                 "valve", "The wiring is in the next section.", "Refer to the installation guide.",
                 "See section 4.2", "For more details about adding missing things, see Chapter 13."):
        assert points_elsewhere(text), text
