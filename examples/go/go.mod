module freetoken.example/decode

go 1.19
