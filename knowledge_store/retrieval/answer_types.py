"""What kind of value a question asks for, and whether a sentence gives one.

"What pressure should the expansion vessel be?" asks for a measurement; the sentence that holds the question's
words best ("The expansion vessel ASSET-104 is a pressure vessel ...") names the thing without giving the value,
and the one that answers ("Read the pre-charge pressure ...: it must be 1.0 bar") holds fewer of them.  Question
answering has long used the expected answer type for this: a question that asks *how long*, *how often*, *how
many* or *what <a measured quantity>* is answered by a sentence holding a value of that kind.

The vocabulary below is English and general (SI and common units, time words, frequency adverbs), not drawn from
any corpus.  ``expected_answer_type`` reads a question; ``AnswerType.given_by`` tells whether a unit of text holds a
value of the type.  A question that asks for nothing measurable (most do) has no expected type and nothing changes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# numbers as digits (10, 1.0, 0,5, 3/4) or words (two, a dozen)
_NUMBER_WORDS = ("one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|fifteen|twenty|thirty|forty|"
                 "fifty|sixty|ninety|hundred|thousand|million|a few|several|a dozen")
_NUMBER = rf"(?:(?<![\w.-])\d+(?:[.,/]\d+)*|\b(?:{_NUMBER_WORDS})\b)"
_RANGE = rf"{_NUMBER}(?:\s*(?:-|–|to|and|or)\s*{_NUMBER})?"
_SPAN = rf"(?:{_RANGE}|\b(?:half\s+)?an?\b)"  # of time: "two hours", "an hour", "half a day"

_TIME_UNITS = (r"ms|milliseconds?|s|secs?|seconds?|mins?|minutes?|h|hrs?|hours?|days?|nights?|weeks?|months?|"
               r"years?|decades?")
_MEASURE_UNITS = (
    _TIME_UNITS + r"|%|percent|per\s?cent|°\s?[CF]?|℃|℉|K|bar|mbar|psi|Pa|hPa|kPa|MPa|atm|V|mV|kV|A|mA|W|kW|MW|"
    r"Wh|kWh|VA|Hz|kHz|MHz|GHz|Ω|kΩ|MΩ|ohms?|dB|dBm|rpm|B|KB|kB|MB|GB|TB|KiB|MiB|GiB|TiB|bytes?|bits?|"
    r"kbps|Mbps|Gbps|mm|cm|m|km|µm|nm|inch(?:es)?|ft|feet|foot|yards?|miles?|mg|g|kg|lbs?|oz|ml|mL|cl|l|L|"
    r"litres?|liters?|gallons?|m²|m³|px|pt|em|characters?|chars?|lines?|items?|entries|times|requests?|"
    r"connections?|users?|clients?|files?|pages?|retries|attempts?|threads?|cores?|processes|tokens?|words?")
_MEASURE = re.compile(rf"{_RANGE}\s?(?:{_MEASURE_UNITS})(?![\w])", re.IGNORECASE)
_DURATION = re.compile(rf"{_SPAN}\s?(?:{_TIME_UNITS})(?![\w])|\b(?:overnight|instantly|immediately)\b",
                       re.IGNORECASE)
_FREQUENCY = re.compile(
    rf"\b(?:hourly|daily|nightly|weekly|fortnightly|monthly|quarterly|yearly|annually|annual|every\s+(?:{_RANGE}\s+)?"
    rf"(?:{_TIME_UNITS}|time|boot|start|login|run)|each\s+(?:{_TIME_UNITS})|{_RANGE}\s+(?:times?\s+)?(?:a|an|per|each)"
    rf"\s+(?:{_TIME_UNITS})|once|twice|continuously|at\s+(?:every|each)\b|(?:{_RANGE}\s+)?times?\s+per\b)",
    re.IGNORECASE)

# a noun a "what <noun> ..." question measures ("what pressure", "what is the maximum size", "what timeout")
_MEASURED_NOUNS = (
    "pressure|temperature|voltage|current|power|wattage|frequency|resistance|capacity|size|length|width|height|"
    "depth|weight|mass|volume|speed|rate|limit|maximum|minimum|threshold|timeout|interval|duration|delay|distance|"
    "range|flow|torque|tension|load|level|percentage|ratio|tolerance|clearance|gap|diameter|thickness|amount|"
    "number|count|quota|budget|lifetime|lifespan|age|cost|price|fee")
_WHAT_MEASURE = re.compile(rf"\b(?:what|which)\b(?:\s+(?:is|are|was|should|must|does|do|the|a|an|its|their|"
                           rf"max(?:imum)?|min(?:imum)?|default|recommended|allowed|required|correct|right))*"
                           rf"(?:\s+[\w-]+){{0,2}}?\s+(?:{_MEASURED_NOUNS})s?\b(?!\s+(?:to|the|a|an)\b)",
                           re.IGNORECASE)
_HOW_MUCH = re.compile(r"\bhow\s+(?:much|many|big|large|small|heavy|high|low|far|fast|hot|cold|warm|wide|deep|"
                       r"tall|thick)\b|\bhow\s+long\s+(?:is|are|can|should|must|may)\s+(?:the\s+|a\s+|an\s+)?"
                       r"(?:[\w-]+\s+)?(?:cable|wire|pipe|hose|line|string|name|key|password|field|path|title|"
                       r"message|url|value|text)s?\b", re.IGNORECASE)
_HOW_LONG = re.compile(r"\bhow\s+long\b|\bhow\s+much\s+time\b|\bwhen\s+(?:does|do|will)\b.*\b(?:expire|time\s?out)\b",
                       re.IGNORECASE)
_HOW_OFTEN = re.compile(r"\bhow\s+(?:often|frequently)\b|\bhow\s+many\s+times\b|\bwhat\s+(?:frequency|interval)\b",
                        re.IGNORECASE)


@dataclass(frozen=True)
class AnswerType:
    """A kind of value a question asks for (``name``), the pattern of a text that gives one, and the words that
    only ask for it (``asking``: "long" and "take" in "how long does the inspection take", which the answer need not
    repeat: "Allow two hours" answers it under the inspection's heading, "Installing takes 45 minutes" does not)."""

    name: str
    value: re.Pattern[str]
    asking: tuple[str, ...] = ()

    def given_by(self, text: str) -> bool:
        """Whether ``text`` holds a value of this type ("1.0 bar", "two hours", "every year")."""
        return self.value.search(text) is not None


MEASUREMENT = AnswerType("measurement", _MEASURE, ("much", "many"))
DURATION = AnswerType("duration", _DURATION, ("long", "much", "time", "take", "last"))
FREQUENCY = AnswerType("frequency", _FREQUENCY, ("often", "frequently", "many", "times"))


def expected_answer_type(question: str) -> AnswerType | None:
    """The kind of value ``question`` asks for: a frequency ("how often"), a duration ("how long"), a measurement
    ("how many", "how much", "what pressure should ... be"); None when it asks for none."""
    if _HOW_OFTEN.search(question):
        return FREQUENCY
    if _HOW_MUCH.search(question):  # before "how long": "how long can a file name be" asks for a length
        return MEASUREMENT
    if _HOW_LONG.search(question):
        return DURATION
    if _WHAT_MEASURE.search(question):
        return MEASUREMENT
    return None


# ---------------------------------------------------------------------------
# questions that ask what to do

# "How do I clear E55?" asks for an action.  The sentence that names E55 best says what it means ("E55 is shown
# when ..."); the one that answers says what to do ("The installer must either remove the O/B wire or ...").
# the phrases that lead to the verb asked for ("how do I", "how to", "steps to")
_HOW_DO_I = r"how\s+(?:do|can|could|should|would|shall|may|must)\s+(?:i|we|you|one|users?|the\s+user)|how\s+to|steps\s+to"
_ASKS_ACTION = re.compile(
    rf"\b(?:{_HOW_DO_I})\b|\bwhat\s+(?:do|should|must|can)\s+(?:i|we|you)\s+do\b", re.IGNORECASE)

# English verbs an instruction opens with ("Remove the wire.", "3. Restart the pump."), general to manuals and
# documentation, not drawn from any corpus.  Words that are as often nouns or adjectives at a sentence's start
# ("Note", "Open source", "Clear text") are left out; "check" is in, as manuals open steps with it far more
# often than with "Check valves".
_INSTRUCTION_VERBS = frozenset("""
add adjust allow append apply attach bleed boot build call change check choose clean click close comment compile configure
connect copy create declare define delete detach disable disconnect download drain drag edit enable enter ensure
erase execute export fill fit fix flush follow format hold import include insert install invoke keep kill launch
load locate log mount move pass paste place plug press print pull purge push put read reboot rebuild recompile
refill register reinstall release reload remove rename repeat replace reset restart restore retry return rotate
run save select send set setup specify start stop submit switch tap tighten turn type unmount uninstall unplug
unset update upgrade upload use verify wait wipe write
""".split())
_VERB_GROUP = "|".join(sorted(_INSTRUCTION_VERBS))


def _gerunds(verb: str) -> set[str]:
    """"remove" -> removing, "set" -> setting (and the undoubled form: "edit" -> editing)."""
    stem = verb[:-1] if verb.endswith("e") and not verb.endswith("ee") else verb
    forms = {stem + "ing"}
    if re.fullmatch(r"[^aeiou]*[aeiou][bdgmnpt]", verb):
        forms.add(verb + verb[-1] + "ing")
    return forms


_GERUND_GROUP = "|".join(sorted(set().union(*(_gerunds(v) for v in _INSTRUCTION_VERBS))))
_ADVERBS = r"(?:(?:first|then|also|always|now|only|just|simply|either|instead|still|manually|usually|typically)\s+)*"
_STEP_NUMBER = r"(?:\d{1,3}[.)]\s+|[-*\u2022]\s+)?"
_INSTRUCTS = re.compile(
    rf"^\W*{_STEP_NUMBER}(?:(?:please|then|now|first|next|finally|simply|just)\s*,?\s+)*(?:{_VERB_GROUP})\b"  # "Remove ..."
    rf"|^\W*(?:to|in\s+order\s+to)\s+\w+[^,.;]*,\s*{_ADVERBS}(?:{_VERB_GROUP})\b"  # "To reset it, press ..."
    rf"|\b(?:must|should|need\s+to|needs\s+to|have\s+to|has\s+to|ought\s+to)\s+{_ADVERBS}(?:{_VERB_GROUP})\b"
    rf"|\b(?:you|one|users?|the\s+user|administrators?)\s+(?:can|could|may)\s+{_ADVERBS}(?:{_VERB_GROUP})\b"
    rf"|\b(?:by|after|before)\s+(?:{_GERUND_GROUP})\b",  # "... is cleared by removing the wire"
    re.IGNORECASE)


def asks_for_action(question: str) -> bool:
    """Whether ``question`` asks what to do ("how do I clear E55", "how to rotate a key", "what should I do")."""
    return _ASKS_ACTION.search(question) is not None


# The verb a how-to question asks to do: the word after "how do I", "how to" or "steps to" ("clear" in "how do I
# clear E55"), past an adverb; "what should I do" names none.
_ASKED_VERB = re.compile(
    rf"\b(?:{_HOW_DO_I})\s+(?:(?:first|then|also|just|actually|properly|safely|correctly)\s+)?([a-z][a-z-]*)\b",
    re.IGNORECASE)


def asked_action(question: str) -> str | None:
    """The verb a how-to question asks to do ("clear" in "how do I clear E55", "rotate" in "how to rotate a key"),
    lower-cased; None when the question names none ("what should I do") or does not ask what to do."""
    match = _ASKED_VERB.search(question)
    return match.group(1).lower() if match else None


def gives_instruction(text: str) -> bool:
    """Whether ``text`` says what to do: it opens with an instruction verb (a step or an imperative sentence), or a
    purpose clause leads to one ("To reset it, press ..."), or someone must, should or can do it ("The installer
    must either remove ..."), or it says how by doing ("cleared by removing ...")."""
    return _INSTRUCTS.search(text) is not None
