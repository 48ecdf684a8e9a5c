"""Django's makemessages, with msgmerge told not to guess: a new string starts untranslated, never as a
"fuzzy" copy of a similar one's translation (msgmerge's default, which put wrong Chinese beside new
labels). `make messages` and the translations test run this command."""

from django.core.management.commands import makemessages


class Command(makemessages.Command):
    msgmerge_options = [*makemessages.Command.msgmerge_options, "--no-fuzzy-matching"]
