"""HTTP routes: the admin (operator console), the API, the chat page."""

from django.contrib import admin
from django.urls import path

from chat.api import api as proactive_api

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", proactive_api.urls),
]
