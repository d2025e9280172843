module freetoken

go 1.19
