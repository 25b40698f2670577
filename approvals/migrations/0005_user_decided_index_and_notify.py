"""The inbox history's index, and on PostgreSQL the trigger that sends NOTIFY.

The trigger notifies ``toolgate_approvals`` (see :mod:`approvals.dbwatch`)
with the approval id whenever a call is gated or its status changes. NOTIFY is
delivered only when the writing transaction commits, so a listener never
reads a row that is not there yet. Other databases get the index alone.
"""

from django.db import migrations, models

CREATE = """
CREATE OR REPLACE FUNCTION approvals_notify() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('toolgate_approvals', NEW.approval_id);
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS approvals_notify ON approvals_approval;
CREATE TRIGGER approvals_notify
    AFTER INSERT OR UPDATE OF status ON approvals_approval
    FOR EACH ROW EXECUTE FUNCTION approvals_notify();
"""

DROP = """
DROP TRIGGER IF EXISTS approvals_notify ON approvals_approval;
DROP FUNCTION IF EXISTS approvals_notify();
"""


def _on_postgresql(sql):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):
    dependencies = [("approvals", "0004_webhooks")]

    operations = [
        migrations.AddIndex(
            model_name="approval",
            index=models.Index(fields=["user", "-decided_at"], name="approvals_user_decided"),
        ),
        migrations.RunPython(_on_postgresql(CREATE), _on_postgresql(DROP), elidable=False),
    ]
