"""HTTP routes: the admin (operator console), the API, the chat page."""

from django.contrib import admin
from django.urls import path

from chat.views import chat_page

urlpatterns = [
    path("admin/", admin.site.urls),
    path("chat/", chat_page, name="chat"),
]
