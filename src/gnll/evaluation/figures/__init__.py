"""The paper's figures beyond the main tables (Fig. 2 ablation; a real model's next-token distributions), used by ``scripts/``."""
