"""CARD whole, in one folder (docs/METHOD.md §1), as peft keeps a tuner.

- the build: settings (config), user clusters (cluster), cluster LoRAs (adapters), the personalization head (head),
  the offline stage that writes them (build; P2P's hypernetwork is trained by p2p/ from it), the decoding choice and
  harm guards on validation people (tune);
- a person: onboarding and fit over a loaded engine (onboard), from the store (person), their own adapter when no
  cluster fits them (own), votes as more of their text (votes), their style and the one scoring rule (style);
- decoding: reward-guided decoding as a LogitsProcessor (decoding), the method classes (method), their decoding as
  rows or alone (card_decode), the steering of its rows in a mixed batch (steer: the Steer of serving.rows), the
  teacher-forced score of a text under a row (score), the neutral rewrites of free-form items (neutral) and the
  style key's format (stylekey).

May import: what personalize.methods may import.
"""
