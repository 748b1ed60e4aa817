"""Standing instructions and preferences: turns that stay relevant after they are said.

"Always include version numbers when I ask about libraries", "from now on answer in
French", "I prefer minimal dependencies", "以后请用中文回答". Such a turn is given once and
must still be found fifty turns later, when the user asks for a new task that the rule
governs: the query is about the task, not about the rule, so ranking alone buries it
(benchmarks/archive/2026-11-25.md, Retrieval v3). A chunk holding one is tagged `instruction`, and
searches return the rules that apply in a list of their own (memsvc.services.search).

Rules, no model: a user (or system) turn is a standing instruction when it has
- "always" / "never" at the start of a clause, after "please", "you should/must", or
  "make sure", followed by an action addressed to the assistant ("always include",
  "never use", "please always format");
- "from now on", "going forward,", "from here on", "in (all your) future answers";
- a condition on the user's own requests: "whenever I ask", "every time I mention";
- a preference: "I prefer", "I'd rather", "my preference", "I want you to";
- their Chinese forms: 请（你）总是/始终/一直/每次/务必/记得/以后, 以后请, 今后请, 从现在开始,
  每次我问, 每当我提到, 我更喜欢, 我偏好, 我希望你, 不要再, 别再, 总是用/使用/提供/回答….
A statement about someone's habits ("they always make us smile", "never give up") is not
one: the clause must be addressed to the assistant. Exact patterns below.
"""

from __future__ import annotations

import re

from memsvc.domain.quick_match import QuickPattern

INSTRUCTION_TAG = "instruction"

# Actions a user asks of an assistant, after "always" / "never".
_ACTIONS = (
    r"include|use|provide|format|add|show|write|respond|reply|answer|mention|explain|list|"
    r"keep|start|end|begin|ask|call|refer|put|avoid|suggest|recommend|follow|check|cite|"
    r"give me|tell me|remind me|double-check|highlight|summari[sz]e|translate|address|"
    r"prioriti[sz]e|focus|consider|offer|present|break|walk me|compare|note|warn|flag|"
    r"specify|state|label|link|quote|assume|stick|limit|wrap|structure|organi[sz]e"
)
STANDING_RULE = re.compile(
    r"(?:^|[.!?;:]\s+|\bplease\s+|\byou (?:should|must|need to|have to)\s+"
    r"|\bmake sure (?:to |you )?)"
    rf"(?:always|never|don't ever|do not ever)\s+(?:\w+\s+)?(?:{_ACTIONS})\b"
    r"|\b(?:from now on|going forward,|from here on"
    r"|in (?:all )?(?:your )?future (?:answers|responses|replies))"
    r"|\b(?:whenever|every time|each time) I (?:ask|mention|request|say|talk|bring up|want"
    r"|need|discuss)"
    r"|\bI(?:'d| would)? prefer\b|\bmy preference\b|\bI(?:'d| would) rather\b"
    r"|\bI (?:like|want|need) (?:it when )?you to\b|\bplease (?:always|never|don't|do not)\b"
    r"|请你?(?:总是|始终|一直|每次|务必|记得|以后|永远)|以后(?:请|回答|都要)|今后请|从现在(?:开始|起)"
    r"|每次我(?:问|提到|说)|每当我(?:问|提到|说)|我更喜欢|我偏好|我希望你|不要再|别再"
    r"|(?:总是|始终|永远)(?:用|使用|包括|提供|回答|给我|写|列出|附上|加上)",
    re.IGNORECASE | re.MULTILINE,
)
_QUICK_RULE = QuickPattern(STANDING_RULE)


def is_standing(text: str) -> bool:
    """Whether a user's or system's turn states a standing instruction or preference."""
    return _QUICK_RULE.search(text)


def gives_rule(speaker: str, text: str) -> bool:
    """Whether a turn states a standing instruction: only a user or the system gives one."""
    return speaker in ("user", "system") and is_standing(text)
