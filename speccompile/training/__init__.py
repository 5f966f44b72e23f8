"""Training draft heads on the target's own answers: prompts (``prompt_set``, ``prompts``,
``magpie``, ``prompt_filters``), answers with features (``answers``, ``store``), the trainers
(``eagle``, ``eagle3``, ``medusa``, ``common``) and ``make heads`` (``heads``).
"""
