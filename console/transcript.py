"""A chat session's transcript in the console (oldest to newest, a page at a time with "load earlier") and the
operator's send box, which writes into the chat through the one send service (chat.services.message_send).

Reading needs the view permission on messages; writing needs `chat.send_operator_message`. A message the
operator sends is an ordinary outbound row (source "admin", the operator named in `extra["operator"]`), so the
outbox delivers it like the bot's own and its fate shows here as every other message's does."""

from __future__ import annotations

from dataclasses import dataclass

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.http import require_POST

from chat.fate import FATE_COLOURS, message_fate
from chat.models import ChatSession, Direction, Message, SourceKind
from chat.services import message_send
from core.config import format_shown, get_config
from core.text import is_blank, text_problem

VIEW_MESSAGES = "chat.view_message"
SEND_OPERATOR_MESSAGE = "chat.send_operator_message"
PAGE_SIZE = 50


@dataclass
class Line:
    """One message as the transcript shows it."""

    message: Message
    outbound: bool
    who: str
    shown_time: str
    fate_label: str = ""
    fate_colour: str = ""


@dataclass
class TranscriptPage:
    """Up to PAGE_SIZE messages, oldest first, ending just before `before` (or at the newest); `earlier` is
    the id to ask for the page before this one, None when this page reaches the first message."""

    lines: list[Line]
    earlier: int | None


def transcript_page(session: ChatSession, *, before: int | None = None, size: int = PAGE_SIZE) -> TranscriptPage:
    """The page of `session`'s transcript that ends just before message `before` (in (time, id) order)."""
    qs = session.messages.all()
    if before is not None:
        anchor = session.messages.filter(pk=before).values_list("time", flat=True).first()
        if anchor is not None:
            qs = qs.filter(Q(time__lt=anchor) | Q(time=anchor, id__lt=before))
    newest_first = list(qs.order_by("-time", "-id")[: size + 1])
    more = len(newest_first) > size
    chunk = newest_first[:size][::-1]
    cfg = get_config()
    lines = [_line(m, cfg.tzinfo, cfg.bot.nickname) for m in chunk]
    return TranscriptPage(lines, chunk[0].pk if more and chunk else None)


def _line(m: Message, tz, nickname: str) -> Line:
    if m.direction != Direction.OUT:
        return Line(m, False, m.sender_cardname or m.sender_nickname or m.sender_id, format_shown(m.time, tz))
    who = nickname
    if m.source_kind == SourceKind.ADMIN:
        operator = (m.extra or {}).get("operator") if isinstance(m.extra, dict) else None
        who = _("Operator %(name)s") % {"name": operator} if operator else _("Operator")
    fate = message_fate(m)
    return Line(m, True, who, format_shown(m.time, tz), str(fate.label), FATE_COLOURS.get(fate, "#6b7280"))


class OperatorMessageForm(forms.Form):
    text = forms.CharField(
        label=gettext_lazy("Message"),
        strip=True,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text=gettext_lazy("Sent into this chat as the bot, through the same outbox as its own messages."),
    )

    def clean_text(self) -> str:
        text = self.cleaned_data["text"]
        limit = get_config().gateway.browser_max_text_length
        if problem := text_problem(text):
            raise forms.ValidationError(_("The message %(problem)s.") % {"problem": problem})
        if is_blank(text):
            raise forms.ValidationError(_("The message is empty."))
        if len(text) > limit:
            raise forms.ValidationError(
                _("The message has %(n)d characters; the limit is %(limit)d (gateway.browser_max_text_length).")
                % {"n": len(text), "limit": limit}
            )
        return text


def _require(request: HttpRequest, perm: str) -> None:
    if not request.user.has_perm(perm):
        raise PermissionDenied


def transcript_view(request: HttpRequest, session_pk: int, form: OperatorMessageForm | None = None) -> HttpResponse:
    _require(request, VIEW_MESSAGES)
    session = get_object_or_404(ChatSession, pk=session_pk)
    before = request.GET.get("before", "")
    page = transcript_page(session, before=int(before) if before.isdigit() else None)
    may_send = request.user.has_perm(SEND_OPERATOR_MESSAGE)
    context = {
        **admin.site.each_context(request),
        "title": _("Transcript: %(session)s") % {"session": session},
        "session": session,
        "page": page,
        "paged": bool(before),
        "time_zone": str(get_config().tzinfo),
        "form": (form or OperatorMessageForm()) if may_send else None,
        "session_admin_url": reverse("admin:chat_chatsession_change", args=[session.pk]),
    }
    return TemplateResponse(request, "admin/maibot/transcript.html", context, status=400 if form else 200)


@require_POST
def transcript_send_view(request: HttpRequest, session_pk: int) -> HttpResponse:
    """The send box: one outbound message through the send service, recorded as the operator's."""
    _require(request, VIEW_MESSAGES)
    _require(request, SEND_OPERATOR_MESSAGE)
    session = get_object_or_404(ChatSession, pk=session_pk)
    form = OperatorMessageForm(request.POST)
    if not form.is_valid():
        return transcript_view(request, session_pk, form)
    message_send(
        session=session,
        source_kind=SourceKind.ADMIN,
        text=form.cleaned_data["text"],
        extra={"operator": request.user.get_username()},
    )
    messages.success(request, _("Queued for delivery; its fate shows below."))
    return redirect("console-transcript", session_pk=session.pk)
