"""The models bench/peers.py runs every tool on, with the references derived by hand (in the comments
beside each): shared by the benchmark and by tests/test_peer_references.py, which checks that
layerscope reproduces every reference. Tests never import bench/; the benchmark imports this."""

from __future__ import annotations



def _hf(config_cls, model_cls, **cfg):
    import transformers as T
    return getattr(T, model_cls)(getattr(T, config_cls)(**cfg)).eval()


def wrap(model, key: str, out: str):
    """One tensor in, one tensor out, for every tool alike (torch is imported late: this file first
    runs outside the benchmark environment, to set it up)."""
    import torch.nn as nn

    class Wrapped(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, x):
            return getattr(self.model(**{key: x}), out)

    return Wrapped()


def gpt2():
    import torch
    m = wrap(_hf("GPT2Config", "GPT2LMHeadModel"), "input_ids", "logits")
    # S = 128 tokens. Per layer: qkv 768*2304 + proj 768*768 + fc 768*3072 + proj 3072*768
    # = 7,077,888 MACs per token; attention Q.K^T and P.V: 2 * S^2 * 768. The LM head: S * 768 * 50,257.
    # 12 * (128 * 7,077,888 + 2 * 128^2 * 768) + 128 * 38,597,376 = 11,173,625,856 + 4,940,464,128
    return m, torch.randint(0, 50257, (1, 128)), 16_114_089_984, 124_439_808


def bert():
    import torch
    m = wrap(_hf("BertConfig", "BertModel"), "input_ids", "last_hidden_state")
    # S = 128: 12 * (128 * (4 * 768^2 + 2 * 768 * 3072) + 2 * 128^2 * 768) + pooler 768^2 (one token)
    # = 12 * (905,969,664 + 25,165,824) + 589,824; params as published for bert-base-uncased
    return m, torch.randint(0, 30522, (1, 128)), 11_174_215_680, 109_482_240


def llama():
    import torch
    m = wrap(_hf("LlamaConfig", "LlamaForCausalLM", hidden_size=512, intermediate_size=1376,
                 num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=8, vocab_size=32000,
                 tie_word_embeddings=False), "input_ids", "logits")
    # S = 128, h = 512, I = 1376: per layer q,k,v,o 4 * 512^2 + MLP 3 * 512 * 1376 = 3,162,112 per
    # token, attention 2 * S^2 * 512; head S * 512 * 32,000.
    # 4 * (128 * 3,162,112 + 2 * 16,384 * 512) + 128 * 16,384,000 = 1,686,110,208 + 2,097,152,000
    # params: 2 * 32,000 * 512 + 4 * (4 * 512^2 + 3 * 512 * 1376 + 2 * 512) + 512 = 45,421,056
    return m, torch.randint(0, 32000, (1, 128)), 3_783_262_208, 45_421_056


def vit():
    import torch
    m = wrap(_hf("ViTConfig", "ViTForImageClassification", num_labels=1000), "pixel_values", "logits")
    # 196 patches of 3*16*16 -> 768: 196 * 768 * 768 = 115,605,504; S = 197 tokens, per layer
    # 197 * 7,077,888 + 2 * 197^2 * 768 = 1,453,954,560, x 12 = 17,447,454,720; classifier on the
    # class token 768 * 1000 = 768,000. Total 17,563,828,224; params 86,567,656 (google/vit-base-patch16-224)
    return m, torch.randn(1, 3, 224, 224), 17_563_828_224, 86_567_656


def _resnet50_macs() -> int:
    # every conv's Cout * Cin * k * k * Hout * Wout, at 224 x 224: stem 7x7/2 to 112, pool to 56
    macs = 64 * 3 * 49 * 112 * 112
    cin, hw = 64, 56
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for b in range(blocks):
            s = stride if b == 0 else 1
            out_hw = hw // s
            macs += width * cin * hw * hw                          # 1x1 reduce (HF: stride on the 3x3)
            macs += width * width * 9 * out_hw * out_hw            # 3x3
            macs += 4 * width * width * out_hw * out_hw            # 1x1 expand
            if b == 0:
                macs += 4 * width * cin * out_hw * out_hw          # projection shortcut
            cin, hw = 4 * width, out_hw
    return macs + 2048 * 1000                                     # classifier


def resnet():
    import torch
    m = wrap(_hf("ResNetConfig", "ResNetForImageClassification", num_labels=1000), "pixel_values", "logits")
    return m, torch.randn(1, 3, 224, 224), _resnet50_macs(), 25_557_032


def cnn_transpose():
    import torch
    import torch.nn as nn
    m = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.ConvTranspose2d(16, 8, 4, stride=2, padding=1),
                      nn.ReLU(), nn.Conv2d(8, 3, 3, padding=1))
    # conv 16*3*9 * 32^2 = 442,368; transposed conv Cin*Cout*k^2 per input pixel 16*8*16 * 32^2 =
    # 2,097,152; conv 3*8*9 * 64^2 = 884,736. Params 448 + 2,056 + 219
    return m, torch.randn(1, 3, 32, 32), 3_424_256, 2_723


def _lstm_net():
    import torch.nn as nn

    class LSTMNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(32, 64, batch_first=True)
            self.fc = nn.Linear(64, 10)

        def forward(self, x):
            return self.fc(self.lstm(x)[0][:, -1])
    return LSTMNet()


def lstm():
    import torch
    # per step 4 gates * 64 * (32 + 64) = 24,576, x 20 steps = 491,520; fc 640.
    # params 4*64*(32+64) + 2*4*64 (two biases) + 650 = 24,576 + 512 + 650
    return _lstm_net(), torch.randn(1, 20, 32), 492_160, 25_738


def _tied_net():
    import torch.nn as nn

    class TiedReused(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(100, 32)
            self.mix = nn.Linear(32, 32)
            self.head = nn.Linear(32, 100)
            self.head.weight = self.emb.weight              # tied

        def forward(self, ids):
            return self.head(self.mix(self.mix(self.emb(ids))))   # mix reused
    return TiedReused()


def tied():
    import torch
    # 16 tokens: mix twice 2 * 16*32*32 = 32,768; head 16*32*100 = 51,200.
    # params: embedding 3,200 (the head's weight is the same tensor) + mix 1,056 + head bias 100
    return _tied_net(), torch.randint(0, 100, (1, 16)), 83_968, 4_356


MODELS = {"GPT-2 small (S=128)": gpt2, "BERT base (S=128)": bert, "Llama shrunk (4x512, S=128)": llama,
          "HF ViT-B/16 (224)": vit, "HF ResNet-50 (224)": resnet, "CNN + ConvTranspose": cnn_transpose,
          "LSTM (T=20)": lstm, "tied + reused": tied}
