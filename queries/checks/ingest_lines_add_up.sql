-- check:   ingest_lines_add_up
-- grain:   one row per violating ingest of a file that loaded into the run
-- inputs:  ingests
-- purpose: every line of every file was accepted, rejected or skipped:
--   lines_read = lines_accepted + lines_rejected + lines_skipped.
select path, lines_read, lines_accepted, lines_rejected, lines_skipped,
    'read ' || lines_read || ' != accepted + rejected + skipped ('
    || (lines_accepted + lines_rejected + lines_skipped) || ')' as problem
from ingests
where list_contains(run_ids, $run_id) and lines_read <> lines_accepted + lines_rejected + lines_skipped
