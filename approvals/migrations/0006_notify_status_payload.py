"""On PostgreSQL, the NOTIFY payload carries the status: ``approval_id:status``.

A process with the waiter of a decided call wakes it from the payload alone,
without reading the table (see :mod:`approvals.pgnotify`). Other databases:
nothing to do.
"""

from django.db import migrations

STATUS_PAYLOAD = """
CREATE OR REPLACE FUNCTION approvals_notify() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('toolgate_approvals', NEW.approval_id || ':' || NEW.status);
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;
"""

ID_PAYLOAD = """
CREATE OR REPLACE FUNCTION approvals_notify() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('toolgate_approvals', NEW.approval_id);
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;
"""


def _on_postgresql(sql):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):
    dependencies = [("approvals", "0005_user_decided_index_and_notify")]

    operations = [
        migrations.RunPython(
            _on_postgresql(STATUS_PAYLOAD), _on_postgresql(ID_PAYLOAD), elidable=False
        ),
    ]
