-- Worker protocol additions: what an attempt printed (a shell command's output, cut to the
-- worker's limit), and the last checkpoint a running attempt recorded, which the ticket's next
-- attempt receives so it can resume.
ALTER TABLE attempts ADD COLUMN output TEXT;
ALTER TABLE tickets ADD COLUMN checkpoint TEXT;
