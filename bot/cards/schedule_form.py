"""The schedule form (issue 32): a Card JSON 2.0 `form` container that creates or edits a schedule (pure).

The form's submit button (`form_action_type: submit`) calls back with `Save(nonce=…)` and Feishu
adds every field's value as the callback's `form_value` keyed by the field's `name` (FIELDS). A refusal renders the
same form again, filled in with what was sent, the refused field named and its fix, in the viewer's language.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bot.i18n import Catalogs, _

from .actions import Detail, Save, Schedules
from .base import Text, button, button_row, card, check_limits, esc, hr, join, markdown, plain, same

FIELDS = ("name", "prompt", "when", "timezone", "profile", "notify")  # the form_value keys a submission carries
DEFAULT_PROFILE = "-"  # the profile option "the hub's default" (a select option needs a non-empty value)
NOTIFY_CHOICES = ("all", "failures", "none")
NOTIFY_OPTIONS = {"all": _("All runs"), "failures": _("Failures only"), "none": _("Off")}
LABELS = {"name": _("Name"), "prompt": _("Prompt"), "when": _("When"), "timezone": _("Timezone"),
          "profile": _("Profile"), "notify": _("Notifications"), "": _("Schedule")}
FIXES = {
    "name": _("Give the schedule a name of at most 200 characters."),
    "prompt": _("Write what each run should ask the agent; the prompt cannot be empty."),
    "when": _("Write a cron expression (`0 3 * * *`), a macro (`@daily`), an interval (`every 30m`) or a date and "
              "time in the future (`2026-12-31 09:00`)."),
    "when_min": _("This rule fires too often for this hub; pick a longer interval."),
    "when_past": _("This time has already passed; pick a date and time in the future."),
    "timezone": _("Use an IANA zone name such as `Asia/Shanghai` or `UTC`."),
    "profile": _("Pick one of the profiles offered in the list."),
    "": _("Check the fields and submit again."),
}


@dataclass(frozen=True, kw_only=True)
class FormView:
    """What the form shows: blank (new) or a schedule's values (edit), with the error of the last submission."""

    nonce: str
    schedule_id: str | None = None              # None: a new schedule
    values: dict[str, str] = field(default_factory=dict)
    profiles: tuple[str, ...] = ()              # the profiles this person may use
    default_timezone: str = "UTC"
    error_field: str | None = None              # a FIXES key
    error_detail: str = ""                      # the hub's own words (English), shown escaped under the fix


def _input(tr: Catalogs, name: str, placeholder: str, value: str, *, multiline: bool = False,
           max_length: int = 1000, required: bool = True) -> dict[str, Any]:
    el: dict[str, Any] = {"tag": "input", "name": name, "required": required, "max_length": max_length,
                          "label": plain(tr.text(LABELS[name])), "label_position": "top",
                          "placeholder": plain(tr.text(placeholder)), "width": "fill"}
    if value:
        el["default_value"] = value
    if multiline:
        el["input_type"] = "multiline_text"
        el["rows"] = 4
        el["auto_resize"] = True
    return el


def _select(tr: Catalogs, name: str, placeholder: str, options: list[tuple[Text, str]],
            initial: str) -> dict[str, Any]:
    return {"tag": "select_static", "name": name, "required": True, "width": "fill",
            "placeholder": plain(tr.text(placeholder)), "initial_option": initial,
            "options": [{"text": plain(label), "value": value} for label, value in options]}


def error_text(tr: Catalogs, field_key: str, detail: str = "") -> Text:
    """Return "**Field**: the fix" in both languages, with the hub's own detail (escaped) under it."""
    label = tr.text(LABELS.get(field_key.split("_")[0], LABELS[""]))
    fix = tr.text(FIXES.get(field_key, FIXES[""]))
    msg = _("Not saved. **{field}**: {fix}")
    line = {lang: tr.gettext(lang, msg).format(field=label[lang], fix=fix[lang]) for lang in label}
    return join(line, same(f"`{esc(detail[:300])}`")) if detail else line


def render_form(v: FormView, tr: Catalogs) -> dict[str, Any]:
    """Render the new-schedule / edit-schedule form."""
    vals = v.values
    profile = vals.get("profile") or DEFAULT_PROFILE
    profiles = [(tr.text(_("Hub default")), DEFAULT_PROFILE)] + [(same(p), p) for p in v.profiles]
    if profile not in [p for _l, p in profiles]:
        profile = DEFAULT_PROFILE
    notify = vals.get("notify") if vals.get("notify") in NOTIFY_CHOICES else "failures"
    elements: list[dict[str, Any]] = []
    if v.error_field is not None:
        elements.append(markdown(error_text(tr, v.error_field, v.error_detail)))
    form = {"tag": "form", "name": "schedule_form", "elements": [
        _input(tr, "name", _("e.g. Nightly report"), vals.get("name", ""), max_length=200),
        _input(tr, "prompt", _("What each run asks the agent"), vals.get("prompt", ""), multiline=True,
               max_length=1000),
        _input(tr, "when", _("e.g. 0 3 * * * · @daily · every 30m · 2026-12-31 09:00"), vals.get("when", ""),
               max_length=200),
        markdown(tr.text(_("**When** takes a cron expression (`0 3 * * *`: every day at 03:00), a macro "
                           "(`@hourly`, `@daily`, `@weekly`, `@monthly`), an interval (`every 30m`, `every 2h`, "
                           "`every 1d`) or one date and time (`2026-12-31 09:00`: once)."))),
        _input(tr, "timezone", _("An IANA zone, e.g. Asia/Shanghai"), vals.get("timezone") or v.default_timezone,
               max_length=64),
        _select(tr, "profile", _("Pick a profile"), profiles, profile),
        _select(tr, "notify", _("Which runs notify"),
                [(tr.text(NOTIFY_OPTIONS[m]), m) for m in NOTIFY_CHOICES], notify),
        {"tag": "button", "name": "submit", "form_action_type": "submit", "type": "primary", "width": "fill",
         "text": plain(tr.text(_("Save") if v.schedule_id else _("Create schedule"))),
         "behaviors": [{"type": "callback",
                        "value": Save(schedule_id=v.schedule_id, nonce=v.nonce).pack()}]},
    ]}
    elements += [form, hr()]
    if v.schedule_id:
        elements.append(button_row(button(tr.text(_("Cancel")), Detail(schedule_id=v.schedule_id))))
    else:
        elements.append(button_row(button(tr.text(_("Cancel")), Schedules())))
    title = _("Edit schedule") if v.schedule_id else _("New schedule")
    return check_limits(card(tr.text(title), elements))


def rule_of(when: str) -> str:
    """Turn the form's "when" into a rule: a bare date and time (`2026-12-31 09:00`) is a one-shot `at` rule;
    anything else (cron, macro, `every N…`, `at …`) is passed on as written."""
    text = " ".join((when or "").split())
    if len(text) >= 10 and text[:4].isdigit() and text[4] == "-" and text[7] == "-":
        return "at " + text.replace(" ", "T", 1)
    return text


def when_of(rule: str) -> str:
    """The form's "when" for a saved rule (an `at` rule shows as its date and time)."""
    return rule[3:].replace("T", " ", 1) if rule.lower().startswith("at ") else rule


def field_of(message: str) -> str:
    """Return which form field (a FIXES key) a ScheduleService refusal is about."""
    low = message.lower()
    if low.startswith("timezone") or "iana zone" in low:
        return "timezone"
    if low.startswith("rule"):
        if "more often" in low:
            return "when_min"
        if "no future fire time" in low:
            return "when_past"
        return "when"
    if low.startswith("name"):
        return "name"
    if low.startswith("prompt"):
        return "prompt"
    if "profile" in low:
        return "profile"
    return ""
