"""The operator chat page: chat with the bot in the browser (platform `web`, a private chat)."""

from __future__ import annotations

from django.contrib.admin.views.decorators import staff_member_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from chat.models import ChatSession, ChatType, make_session_id
from chat.outbox_rows import WEB_PLATFORM
from chat.wire.outbound import browser_frame

HISTORY = 50


@staff_member_required
def chat_page(request: HttpRequest) -> HttpResponse:
    session_id = make_session_id(WEB_PLATFORM, ChatType.PRIVATE, str(request.user.pk))
    session = ChatSession.objects.filter(session_id=session_id).first()
    history = []
    if session is not None:
        recent = list(session.messages.order_by("-time", "-id")[:HISTORY])
        history = [browser_frame(m) for m in reversed(recent)]
    return render(request, "chat/chat.html", {"history": history})
