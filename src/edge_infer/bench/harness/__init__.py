"""The benchmark framework: grid runs, statistics, checks, results, reports, archives, and what every arm shares."""
