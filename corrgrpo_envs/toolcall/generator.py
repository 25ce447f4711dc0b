"""A seeded procedural generator of tool-calling tasks (the default data set).

Each task draws one of several dialogue kinds:

* ``single``: one call; ``multi``: two calls to different tools;
  ``parallel``: the same tool twice with different arguments;
* ``call_and_reply``: a call plus a short reply in the same answer;
* ``chat`` and ``missing_info``: no call, a reply only (small talk, or a
  request that lacks a required argument);
* ``follow_up``: an earlier call and its ``<obs>`` result are in the
  history, and the answer is a reply that reports the result.

Tools come from a dozen families (weather, currency, email, reminders,
flights, stocks, tips, translation, sums, restaurants, clocks, thermostats)
with string, integer, number, boolean, enum and array arguments. Every
argument value appears in the user's words, so a small model can learn to
copy it into the right slot. Task ``i`` depends only on ``(seed, i)``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from corrgrpo_envs.toolcall.answer_format import render_answer
from corrgrpo_envs.toolcall.prompts import dialogue_history, system_prompt

__all__ = ["generate_task", "TOOL_FAMILIES", "TASK_KINDS"]

_CITIES = ["Paris", "Tokyo", "Lima", "Cairo", "Oslo", "Denver", "Mumbai", "Sydney", "Berlin", "Toronto"]
_CURRENCIES = ["USD", "EUR", "JPY", "GBP", "CHF", "INR", "CAD"]
_NAMES = ["alice", "bob", "carol", "dmitri", "erin", "farah", "li", "mateo"]
_DOMAINS = ["example.com", "mail.org", "work.net"]
_SUBJECTS = ["budget review", "team lunch", "project update", "travel plans", "invoice 42"]
_TASKS = ["call the dentist", "water the plants", "submit the report", "buy milk", "stretch"]
_SYMBOLS = ["AAPL", "MSFT", "TSLA", "NVDA", "AMZN", "IBM"]
_LANGS = ["French", "Spanish", "German", "Japanese", "Italian"]
_PHRASES = ["good morning", "thank you very much", "where is the station", "see you tomorrow"]
_RESTAURANTS = ["Blue Fig", "Casa Luna", "The Oak Room", "Sakura House", "Golden Wok"]
_TIMEZONES = ["UTC", "Europe/London", "Asia/Tokyo", "America/New_York", "Australia/Sydney"]


@dataclass(frozen=True)
class _Tool:
    name: str
    description: str
    params: dict[str, dict[str, Any]]  # JSON-schema properties
    required: tuple[str, ...]
    draw: Callable[[random.Random], dict[str, Any]]  # argument values
    ask: tuple[str, ...]  # user requests, formatted with the arguments
    missing: str  # a request that lacks a required argument
    result: Callable[[dict[str, Any]], str]  # what the tool returns, as text

    def schema(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "parameters": {"type": "object", "properties": self.params, "required": list(self.required)},
        }


def _p(type_: str, description: str, **extra: Any) -> dict[str, Any]:
    return {"type": type_, "description": description, **extra}


def _email(r: random.Random) -> str:
    return f"{r.choice(_NAMES)}@{r.choice(_DOMAINS)}"


TOOL_FAMILIES: tuple[_Tool, ...] = (
    _Tool(
        "get_weather",
        "Current weather in a city.",
        {"city": _p("string", "City name."), "unit": _p("string", "Temperature unit.", enum=["celsius", "fahrenheit"])},
        ("city", "unit"),
        lambda r: {"city": r.choice(_CITIES), "unit": r.choice(["celsius", "fahrenheit"])},
        ("What's the weather in {city} right now, in {unit}?", "Tell me the {city} weather in {unit}."),
        "What's the weather like today?",
        lambda a: f"{a['city']}: 21 degrees {a['unit']}, light wind",
    ),
    _Tool(
        "convert_currency",
        "Convert an amount between two currencies.",
        {
            "amount": _p("number", "Amount to convert."),
            "from_currency": _p("string", "ISO code of the source currency."),
            "to_currency": _p("string", "ISO code of the target currency."),
        },
        ("amount", "from_currency", "to_currency"),
        lambda r: dict(
            zip(
                ("amount", "from_currency", "to_currency"),
                (r.choice([r.randint(5, 900), round(r.uniform(1, 500), 2)]), *r.sample(_CURRENCIES, 2)),
            )
        ),
        ("Convert {amount} {from_currency} to {to_currency}.", "How much is {amount} {from_currency} in {to_currency}?"),
        "Can you convert some money for me?",
        lambda a: f"{a['amount']} {a['from_currency']} = 1.08 x {a['amount']} {a['to_currency']}",
    ),
    _Tool(
        "send_email",
        "Send an email.",
        {"to": _p("string", "Recipient address."), "subject": _p("string", "Subject line.")},
        ("to", "subject"),
        lambda r: {"to": _email(r), "subject": r.choice(_SUBJECTS)},
        ("Email {to} with the subject '{subject}'.", "Send a message to {to} titled '{subject}'."),
        "Please send an email for me.",
        lambda a: f"email to {a['to']} sent",
    ),
    _Tool(
        "create_reminder",
        "Remind the user of something after some minutes.",
        {"text": _p("string", "What to remind."), "minutes": _p("integer", "Delay in minutes.")},
        ("text", "minutes"),
        lambda r: {"text": r.choice(_TASKS), "minutes": r.choice([5, 10, 15, 30, 45, 60, 90])},
        ("Remind me to {text} in {minutes} minutes.", "In {minutes} minutes, remind me to {text}."),
        "Set a reminder for me.",
        lambda a: f"reminder '{a['text']}' set for {a['minutes']} minutes",
    ),
    _Tool(
        "search_flights",
        "Search flights between two cities on a date.",
        {
            "origin": _p("string", "Departure city."),
            "destination": _p("string", "Arrival city."),
            "date": _p("string", "Date, YYYY-MM-DD."),
            "nonstop": _p("boolean", "Only nonstop flights."),
        },
        ("origin", "destination", "date", "nonstop"),
        lambda r: dict(
            zip(("origin", "destination"), r.sample(_CITIES, 2)),
            date=f"2025-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}",
            nonstop=r.random() < 0.5,
        ),
        ("Find {stops} flights from {origin} to {destination} on {date}.", "I need to fly {origin} to {destination} on {date}, {stops} please."),
        "Find me a flight.",
        lambda a: f"3 flights from {a['origin']} to {a['destination']} on {a['date']}, from 180 USD",
    ),
    _Tool(
        "get_stock_price",
        "Latest price of a stock.",
        {"symbol": _p("string", "Ticker symbol.")},
        ("symbol",),
        lambda r: {"symbol": r.choice(_SYMBOLS)},
        ("What is {symbol} trading at?", "Get me the stock price of {symbol}."),
        "How is my stock doing?",
        lambda a: f"{a['symbol']}: 187.20 USD",
    ),
    _Tool(
        "calculate_tip",
        "Tip for a restaurant bill.",
        {"bill": _p("number", "Bill amount."), "percent": _p("integer", "Tip percentage.")},
        ("bill", "percent"),
        lambda r: {"bill": r.choice([r.randint(10, 200), round(r.uniform(10, 200), 2)]), "percent": r.choice([10, 12, 15, 18, 20, 25])},
        ("What's a {percent}% tip on a {bill} bill?", "Calculate a {percent} percent tip for {bill}."),
        "How much should I tip?",
        lambda a: f"tip: {round(a['bill'] * a['percent'] / 100, 2)}",
    ),
    _Tool(
        "translate_text",
        "Translate text into another language.",
        {"text": _p("string", "Text to translate."), "target_language": _p("string", "Language to translate into.", enum=_LANGS)},
        ("text", "target_language"),
        lambda r: {"text": r.choice(_PHRASES), "target_language": r.choice(_LANGS)},
        ("Translate '{text}' into {target_language}.", "How do you say '{text}' in {target_language}?"),
        "Can you translate something?",
        lambda a: f"translation into {a['target_language']} ready",
    ),
    _Tool(
        "sum_numbers",
        "Add a list of integers.",
        {"numbers": _p("array", "The integers to add.", items={"type": "integer"})},
        ("numbers",),
        lambda r: {"numbers": [r.randint(1, 99) for _ in range(r.randint(2, 5))]},
        ("Add up {numbers_text}.", "What is the sum of {numbers_text}?"),
        "Can you add some numbers for me?",
        lambda a: f"sum = {sum(a['numbers'])}",
    ),
    _Tool(
        "book_table",
        "Reserve a restaurant table.",
        {
            "restaurant": _p("string", "Restaurant name."),
            "people": _p("integer", "Number of guests."),
            "time": _p("string", "Time, HH:MM."),
        },
        ("restaurant", "people", "time"),
        lambda r: {"restaurant": r.choice(_RESTAURANTS), "people": r.randint(1, 8), "time": f"{r.randint(17, 22)}:{r.choice(['00', '15', '30', '45'])}"},
        ("Book a table for {people} at {restaurant} at {time}.", "Reserve {restaurant} for {people} people at {time}."),
        "Book me a table tonight.",
        lambda a: f"table for {a['people']} at {a['restaurant']}, {a['time']}, confirmed",
    ),
    _Tool(
        "get_time",
        "Current time in a time zone.",
        {"timezone": _p("string", "IANA time zone or UTC.")},
        ("timezone",),
        lambda r: {"timezone": r.choice(_TIMEZONES)},
        ("What time is it in {timezone}?", "Give me the current time for {timezone}."),
        "What time is it there?",
        lambda a: f"{a['timezone']}: 14:05",
    ),
    _Tool(
        "set_thermostat",
        "Set the home thermostat.",
        {"temperature": _p("integer", "Target in degrees Celsius."), "eco_mode": _p("boolean", "Energy-saving mode.")},
        ("temperature", "eco_mode"),
        lambda r: {"temperature": r.randint(16, 26), "eco_mode": r.random() < 0.5},
        ("Set the thermostat to {temperature} degrees with eco mode {eco}.", "Put the heating at {temperature}, eco mode {eco}."),
        "Change the thermostat, please.",
        lambda a: f"thermostat at {a['temperature']}, eco {'on' if a['eco_mode'] else 'off'}",
    ),
)

TASK_KINDS = {
    "single": 0.30,
    "multi": 0.17,
    "parallel": 0.13,
    "call_and_reply": 0.08,
    "chat": 0.10,
    "missing_info": 0.10,
    "follow_up": 0.12,
}
_CHAT = [
    ("Hi there! How are you?", "Hello! I'm doing well. How can I help you today?"),
    ("Thanks, that's all for now.", "You're welcome! Have a great day."),
    ("Who are you?", "I'm an assistant that can use tools to help with your tasks."),
    ("Tell me a fun fact.", "Octopuses have three hearts."),
]
_JOIN = [" Also, ", " Then ", " And "]


def _request(tool: _Tool, args: dict[str, Any], r: random.Random) -> str:
    words = dict(args)
    if "numbers" in args:
        nums = [str(n) for n in args["numbers"]]
        words["numbers_text"] = ", ".join(nums[:-1]) + " and " + nums[-1]
    if "nonstop" in args:
        words["stops"] = "nonstop" if args["nonstop"] else "any (stops are fine)"
    if "eco_mode" in args:
        words["eco"] = "on" if args["eco_mode"] else "off"
    return r.choice(tool.ask).format(**words)


def _draw_distinct(tool: _Tool, r: random.Random, than: dict[str, Any]) -> dict[str, Any]:
    for _ in range(20):
        args = tool.draw(r)
        if args != than:
            return args
    return args


def _short_system_prompt(tools: list[dict[str, Any]]) -> str:
    """A compact system prompt: one ``name(arg: type, ...)`` line per tool and the answer layout."""
    lines = ["Tools:"]
    for tool in tools:
        args = ", ".join(f"{k}: {v['type']}" for k, v in tool["parameters"]["properties"].items())
        lines.append(f"{tool['name']}({args})")
    lines.append("Answer: <think> ... </think>, then <tool_call> one JSON call per line </tool_call> and/or <response> ... </response>.")
    return "\n".join(lines)


def generate_task(seed: int, index: int, max_extra_tools: int = 3, prompt: str = "rlla") -> dict[str, Any]:
    """Task ``index`` of the generator with ``seed``: messages, tools, expected calls and reply.

    Each task lists its needed tools plus 0..``max_extra_tools`` distractors (the default 3
    gives the original data set). ``prompt="short"`` replaces the RLLA system prompt by
    :func:`_short_system_prompt` (prompts of about 60 tokens, for small models on a CPU).
    """
    if prompt not in ("rlla", "short"):
        raise ValueError(f"prompt must be 'rlla' or 'short', got {prompt!r}")
    if max_extra_tools < 0:
        raise ValueError(f"max_extra_tools must be >= 0, got {max_extra_tools}")
    r = random.Random(f"corrgrpo-toolcall-{seed}-{index}")
    kind = r.choices(list(TASK_KINDS), weights=list(TASK_KINDS.values()))[0]
    n_used = 2 if kind == "multi" else 1
    families = r.sample(TOOL_FAMILIES, n_used + r.randint(0, max_extra_tools))
    used = families[:n_used]
    r.shuffle(families)
    calls: list[dict[str, Any]] = []
    response: str | None = None
    turns: list[tuple[str, str]] = []
    if kind in ("single", "call_and_reply"):
        args = used[0].draw(r)
        calls = [{"name": used[0].name, "parameters": args}]
        request = _request(used[0], args, r)
        if kind == "call_and_reply":
            request += " Let me know once it's underway."
            response = "I've started that for you; the result will follow."
        turns = [("user", request)]
    elif kind == "multi":
        parts = []
        for tool in used:
            args = tool.draw(r)
            calls.append({"name": tool.name, "parameters": args})
            parts.append(_request(tool, args, r))
        turns = [("user", parts[0] + r.choice(_JOIN) + parts[1][0].lower() + parts[1][1:])]
    elif kind == "parallel":
        first = used[0].draw(r)
        second = _draw_distinct(used[0], r, first)
        calls = [{"name": used[0].name, "parameters": a} for a in (first, second)]
        a, b = _request(used[0], first, r), _request(used[0], second, r)
        turns = [("user", a + r.choice(_JOIN) + b[0].lower() + b[1:])]
    elif kind == "chat":
        question, response = r.choice(_CHAT)
        turns = [("user", question)]
    elif kind == "missing_info":
        tool = used[0]
        turns = [("user", tool.missing)]
        needed = ", ".join(tool.required)
        response = f"Sure. To use {tool.name} I need: {needed}. Could you tell me?"
    else:  # follow_up
        tool = used[0]
        args = tool.draw(r)
        earlier = render_answer([{"name": tool.name, "parameters": args}], think="I should call the tool.")
        result = tool.result(args)
        turns = [("user", _request(tool, args, r)), ("raw", earlier), ("obs", result)]
        response = f"Here is the result: {result}."
    tools = [t.schema() for t in families]
    # without the Required lines: the generated data sets stay the ones recorded runs trained on
    system = system_prompt(tools, required=False) if prompt == "rlla" else _short_system_prompt(tools)
    return {
        "kind": kind,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": dialogue_history(turns)},
        ],
        "tools": tools,
        "expected_calls": calls,
        "expects_response": response is not None,
        "response": response,
    }
