"""What an extractive answer may quote: a passage cut into sentences, list items and table rows, and the units it
never quotes (headings, header rows, intros, fragments, code), in the forms the parsers store passages in."""

from __future__ import annotations

from knowledge_store.retrieval.answer_units import answer_units, render_row, table_cells

MARKDOWN = """## Rate limits

Each API client may send **10 requests** per second; bursts of up to 20 are
allowed. Requests above the limit are answered with `429 Too Many Requests` and a
`Retry-After` header. See [the table](#errors) &amp; the log.

To clear the alarm:

1. Switch off power and check the wires are
   firmly seated in S1 and S2.
2. Measure the sensor.

- Type: integer
- Default: 5 minutes

| Code | Meaning | What to do |
|------|---------|------------|
| `E47` | No contact with the Hub | See offline steps |

```bash
curl -X POST https://hub.local/api \\
  -d x=1
```

Yes.
Wiring notes
"""


def _kinds(text: str, headings=()) -> list[tuple[str, str]]:
    return [(u.kind, u.text) for u in answer_units(text, headings)]


def test_a_markdown_passage_is_cut_into_what_a_reader_sees():
    units = _kinds(MARKDOWN, headings=("Aurora Hub REST API Guide", "Rate limits"))
    assert units == [
        ("heading", "## Rate limits"),
        # hard-wrapped prose stays whole although its lines hold ';' and backticks; markup removed
        ("sentence", "Each API client may send 10 requests per second; bursts of up to 20 are allowed."),
        ("sentence", "Requests above the limit are answered with 429 Too Many Requests and a Retry-After header."),
        ("sentence", "See the table & the log."),
        ("intro", "To clear the alarm:"),
        ("item", "1. Switch off power and check the wires are firmly seated in S1 and S2."),  # a step stays a step
        ("item", "2. Measure the sensor."),
        ("item", "Type: integer"),
        ("item", "Default: 5 minutes"),
        ("header", "Code | Meaning | What to do"),
        ("rule", ""),
        ("row", "E47 \u2014 Meaning: No contact with the Hub; What to do: See offline steps"),
        ("code", "bash curl -X POST https://hub.local/api \\ -d x=1"),
        ("fragment", "Yes."),
        ("fragment", "Wiring notes"),
    ]
    spans = [(u.start, u.end) for u in answer_units(MARKDOWN)]
    assert spans == sorted(spans) and all(MARKDOWN[s:e].strip() == MARKDOWN[s:e] for s, e in spans)


def test_the_items_of_one_list_share_a_block_across_blank_lines_and_a_paragraph_has_its_own():
    text = "Check, in this order:\n\n\u2022 The breaker is on.\n\n\u2022 The fuse is intact.\n\nAfter power returns, the display lights up."
    units = answer_units(text)
    assert [u.kind for u in units] == ["intro", "item", "item", "sentence"]
    assert units[1].block == units[2].block != units[3].block
    assert units[1].text == "The breaker is on."  # a bullet is not quoted, a number is


def test_an_html_or_word_table_has_its_header_when_it_starts_inside_the_passage():
    text = ("When the thermostat detects a fault it shows a code. Codes clear automatically.\n\n"
            "Code | Meaning | What to do\n"
            "E10 | No 24 V AC supply on R/C | See The screen is blank\n"
            "E47 | No contact with the Aurora Hub for more than 15 minutes | See offline steps")
    units = answer_units(text)
    assert [u.kind for u in units] == ["sentence", "sentence", "header", "row", "row"]
    assert units[4].text == ("E47 \u2014 Meaning: No contact with the Aurora Hub for more than 15 minutes; "
                             "What to do: See offline steps")


def test_a_table_that_opens_the_passage_has_a_header_only_when_its_first_row_reads_as_labels():
    labels = answer_units("Issue | Component | Summary\nAUR-1187 | Hub | Webhook deliveries were not retried.")
    assert [u.kind for u in labels] == ["header", "row"]
    assert labels[1].text == "AUR-1187 \u2014 Component: Hub; Summary: Webhook deliveries were not retried."
    continued = answer_units("E60 | Clock not set | Connect to Wi-Fi\nE71 | Firmware image failed | Retry the update")
    assert [u.kind for u in continued] == ["row", "row"]  # the header is in the chunk before
    assert continued[0].text == "E60 \u2014 Clock not set \u2014 Connect to Wi-Fi"


def test_a_one_sentence_paragraph_before_a_table_introduces_it():
    text = "Issues fixed in the 3.x series, by the release that contains the fix.\n\nIssue | Fixed in\nAUR-1 | 3.4"
    assert [u.kind for u in answer_units(text)] == ["intro", "header", "row"]
    assert answer_units(text)[2].text == "AUR-1: 3.4"  # two columns: key and value


def test_fragments_and_headings_are_recognised():
    assert _kinds("steal power through the heating wires. The Aurora needs a C wire.") == [
        ("fragment", "steal power through the heating wires."),  # the passage starts inside a sentence
        ("sentence", "The Aurora needs a C wire."),
    ]
    assert _kinds("Installer code\n\nThe code is printed on the label of the display unit.") == [
        ("heading", "Installer code"), ("sentence", "The code is printed on the label of the display unit.")]
    assert _kinds("Restoring factory settings.", headings=("Manual", "Restoring factory settings"))[0][0] == "heading"
    assert _kinds("Yes. The Aurora needs a common wire.")[0] == ("fragment", "Yes.")
    cut = answer_units("It accepts wire from 0.5 to 1.0 mm\u00b2 (18 to 22 AWG) and switches at most 1 A at\n30 V AC")
    assert [u.kind for u in cut] == ["fragment"] and not cut[0].quoted  # no sentence end: cut by the chunk


def test_cells_and_rows():
    assert table_cells("| `hvac.min_cycle_minutes` | integer | `5` |") == ["hvac.min_cycle_minutes", "integer", "5"]
    assert table_cells("a | b \\| c | d") == ["a", "b | c", "d"]
    assert render_row(["Power supply", "24 V AC"], ["Property", "Value"]) == "Power supply: 24 V AC"
    assert render_row(["Y1", "Compressor", "", "\u2013"], ["Terminal", "Function", "Colour", "Notes"]) == \
        "Y1 \u2014 Function: Compressor"
    assert render_row(["a", "b"], None) == "a \u2014 b"
