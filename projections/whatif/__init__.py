"""What-if: re-decide recorded turns under a candidate configuration (DESIGN §8 `whatif`). Pure: no I/O, no clock.

`TurnRecorder` folds `<app>.conversations` under the configuration versions that were in force (as the worker
did) and keeps every route run that reached a decision: the state right after the run started, the events
folded until it ended, and which recorded outcome answered which of its commands. `compare_turn` then replays
that run through the *same fold* under the candidate configuration, answering each command it issues:

- with the recorded outcome of the same command at the same point of the procedure (same op and parameters,
  same phase and purpose), when there is one; other events of the window (webhooks, sweeps, timers) are folded
  in their recorded order in between;
- for System One, with the recorded answer when the candidate asks exactly the question the live run asked
  (same owners, topics, kinds and model, hence the same request body); otherwise the turn "needs a new
  decision", unless `answers` holds System One's answer to the new question (`whatif --ask`);
- otherwise as the world most likely answered: a mutation succeeds (and later re-reads see it), a re-read the
  live run did not make sees what the live run's last read of that kind saw; a reply-history scan follows the
  reply ledger, canned responses exist, and the agents are the last list recorded for the account (these
  three are named as the side's assumptions).

So the identity candidate reproduces every live turn exactly, and any change is evaluated by the live rules.
Each turn is compared on its own, from the live state before it: a difference in one turn does not carry
over to the next.
"""
