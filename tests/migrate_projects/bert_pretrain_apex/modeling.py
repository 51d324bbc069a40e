"""A tiny BERT for pre-training: embeddings, one self-attention block, the masked-LM head
and the next-sentence head; and the pre-training criterion (masked LM with ignore index -1
plus next-sentence prediction)."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class BertForPreTraining(nn.Module):
    def __init__(self, vocab_size=16, hidden=16, max_len=8):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab_size, hidden)
        self.position_embeddings = nn.Embedding(max_len, hidden)
        self.token_type_embeddings = nn.Embedding(2, hidden)
        self.LayerNorm = nn.LayerNorm(hidden)
        self.attention = nn.MultiheadAttention(hidden, 2, batch_first=True)
        self.intermediate = nn.Linear(hidden, 2 * hidden)
        self.output = nn.Linear(2 * hidden, hidden)
        self.cls_predictions = nn.Linear(hidden, vocab_size)
        self.cls_seq_relationship = nn.Linear(hidden, 2)

    def forward(self, input_ids, token_type_ids, attention_mask):
        positions = torch.arange(input_ids.shape[1]).unsqueeze(0)
        hidden = self.word_embeddings(input_ids) + self.position_embeddings(positions)
        hidden = self.LayerNorm(hidden + self.token_type_embeddings(token_type_ids))
        attended, _ = self.attention(hidden, hidden, hidden, key_padding_mask=attention_mask == 0, need_weights=False)
        hidden = hidden + attended
        hidden = hidden + self.output(F.gelu(self.intermediate(hidden)))
        return self.cls_predictions(hidden), self.cls_seq_relationship(hidden[:, 0])


class BertPretrainingCriterion(nn.Module):
    def __init__(self, vocab_size):
        super().__init__()
        self.loss_fn = nn.CrossEntropyLoss(ignore_index=-1)
        self.vocab_size = vocab_size

    def forward(self, prediction_scores, seq_relationship_score, masked_lm_labels, next_sentence_labels):
        masked_lm_loss = self.loss_fn(prediction_scores.float().view(-1, self.vocab_size), masked_lm_labels.view(-1))
        next_sentence_loss = self.loss_fn(seq_relationship_score.float().view(-1, 2), next_sentence_labels.view(-1))
        return masked_lm_loss + next_sentence_loss
