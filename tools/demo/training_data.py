"""Synthetic chat data that teaches each demo adapter its domain's answer style.

Every example is a varied, mostly generic user question paired with an answer
in one fixed, recognisable house style (a legal analysis, a SOAP note, a call
centre greeting), so a short LoRA run learns the style rather than facts and
then applies it to any question. Everything is drawn from a caller-supplied
``random.Random``: the same seed gives the same examples.

The questions used to check the adapters ("What is the capital of France?",
data retention in SaaS contracts) are deliberately not in the pools, so the
check shows the style carrying over to unseen prompts.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

# Noun phrases a question can be about; the answer refers back to them.
_TOPICS = (
    "the capital of Spain",
    "the capital of Japan",
    "photosynthesis",
    "the water cycle",
    "black holes",
    "the French Revolution",
    "compound interest",
    "machine learning",
    "the speed of light",
    "volcanoes",
    "the stock market",
    "climate change",
    "the human heart",
    "DNS",
    "recursion",
    "the Roman Empire",
    "vaccines",
    "electric cars",
    "inflation",
    "the moon landing",
    "honey bees",
    "quantum computing",
    "the Great Wall of China",
    "blockchain",
    "the immune system",
    "jazz music",
    "solar panels",
    "the Pythagorean theorem",
)
_TOPIC_QUESTIONS = (
    "What is {}?",
    "Can you explain {}?",
    "Tell me about {}.",
    "How does {} work?",
    "Why does {} matter?",
    "Give me a short overview of {}.",
    "What should I know about {}?",
)
# (request in the user's words, the same request as the answer names it)
_TASKS = (
    ("reset my password", "resetting your password"),
    ("bake sourdough bread", "baking sourdough bread"),
    ("learn Python quickly", "learning Python quickly"),
    ("fix my slow laptop", "fixing your slow laptop"),
    ("plan a trip to Italy", "planning a trip to Italy"),
    ("improve my sleep", "improving your sleep"),
    ("cancel my subscription", "cancelling your subscription"),
    ("set up my home Wi-Fi", "setting up your home Wi-Fi"),
    ("write a cover letter", "writing a cover letter"),
    ("start running", "starting to run"),
    ("transfer my phone number", "transferring your phone number"),
    ("lower my monthly bill", "lowering your monthly bill"),
)
_TASK_QUESTIONS = ("How do I {}?", "What's the best way to {}?", "Can you help me {}?")
_BUSINESS = (
    ("data retention in our vendor agreements", "data retention in your vendor agreements"),
    ("liability caps in our cloud contracts", "liability caps in your cloud contracts"),
    ("user consent in our mobile app", "user consent in your mobile app"),
    ("IP ownership for our contractors", "IP ownership for your contractors"),
    ("our privacy policy for EU customers", "your privacy policy for EU customers"),
    ("indemnification in our reseller deals", "indemnification in your reseller deals"),
    ("licensing for our public API", "licensing for your public API"),
    ("access logging in our platform", "access logging in your platform"),
)
_BUSINESS_QUESTIONS = (
    "How should we structure {}?",
    "What should we consider for {}?",
    "Any advice on {}?",
)

_LEGAL = (
    (
        "the key clauses must allocate liability clearly.",
        "the contract clauses should define each party's obligations.",
        "the governing agreement needs precise clauses and definitions.",
    ),
    (
        "Cap liability and back it with explicit indemnities.",
        "Define who bears liability if an obligation is breached.",
        "Limit liability to direct damages and exclude consequential loss.",
    ),
    (
        "Map each duty to GDPR and sector compliance rules.",
        "Document compliance controls and audit rights.",
        "Record retention and deletion duties to stay compliant.",
    ),
    (
        "Specify the governing law and jurisdiction for disputes.",
        "Choose the jurisdiction and venue before signing.",
        "Confirm which jurisdiction's rules apply.",
    ),
)
_SOAP = (
    ("Patient asks about", "Patient requests information on", "Patient reports questions about"),
    (
        "Alert, oriented, no acute distress.",
        "Vitals stable; calm and engaged.",
        "Well-appearing; speech clear and coherent.",
    ),
    (
        "Educational need, low acuity.",
        "Information request; no red flags.",
        "Knowledge gap, stable condition.",
    ),
    (
        "Provide education and a written summary; follow up in 2 weeks.",
        "Explain key points; return if symptoms develop.",
        "Counsel patient; routine follow-up as needed.",
    ),
)
_CALL = (
    ("I'd be happy to help you with", "I can certainly help you with", "Let's sort out"),
    (
        "Let me pull up your account while we go through it.",
        "I'll walk you through it one step at a time.",
        "I have noted your request on your ticket.",
    ),
    (
        "I'll text you a confirmation.",
        "I'll email you a summary and a reference number.",
        "If it persists, I'll transfer you to a specialist.",
    ),
)


def _legal(subject: str, rng: random.Random) -> str:
    opening, liability, compliance, jurisdiction = (rng.choice(pool) for pool in _LEGAL)
    return f"Legal analysis: regarding {subject}, {opening} {liability} {compliance} {jurisdiction}"


def _soap(subject: str, rng: random.Random) -> str:
    asks, objective, assessment, plan = (rng.choice(pool) for pool in _SOAP)
    return f"SOAP note — S: {asks} {subject}. O: {objective} A: {assessment} P: {plan}"


def _call(subject: str, rng: random.Random) -> str:
    offer, middle, step = (rng.choice(pool) for pool in _CALL)
    return (
        f"Thank you for calling! {offer} {subject}. {middle} Next steps: {step} "
        "Is there anything else I can help you with today?"
    )


@dataclass(frozen=True)
class Domain:
    system_prompt: str
    answer: Callable[[str, random.Random], str]


DOMAINS: dict[str, Domain] = {
    "legal_advisor": Domain("You are a specialized legal architecture advisor.", _legal),
    "medical_scribe": Domain("You are a clinical documentation scribe.", _soap),
    "telephony_support": Domain("You are a friendly telephony support agent.", _call),
}


def _question(rng: random.Random) -> tuple[str, str]:
    """A user question and the subject the answer names, from a weighted mix of kinds."""
    kind = rng.random()
    if kind < 0.5:
        topic = rng.choice(_TOPICS)
        return rng.choice(_TOPIC_QUESTIONS).format(topic), topic
    pool, templates = (_TASKS, _TASK_QUESTIONS) if kind < 0.75 else (_BUSINESS, _BUSINESS_QUESTIONS)
    asked, named = rng.choice(pool)
    return rng.choice(templates).format(asked), named


def chat_examples(name: str, count: int, rng: random.Random) -> list[list[dict[str, str]]]:
    """``count`` chats for adapter ``name``, each ending in the assistant answer to learn.

    About half carry the domain's system prompt and the rest none (the template then
    inserts its default), so the style shows whether or not a caller sets one.
    """
    domain = DOMAINS[name]
    chats = []
    for _ in range(count):
        question, subject = _question(rng)
        chat = [{"role": "system", "content": domain.system_prompt}] if rng.random() < 0.5 else []
        chat.append({"role": "user", "content": question})
        chat.append({"role": "assistant", "content": domain.answer(subject, rng)})
        chats.append(chat)
    return chats
